"""The judge reward against a real OpenAI-compatible HTTP server on loopback (Starlette on
uvicorn): the request it sends, how replies are read, the cache, the concurrency cap,
abstaining on failures and time-outs, and its place in a reward config."""

import asyncio
import gzip
import json
import threading
import time

import pytest
import torch

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from rlvr.rewards import judge as judge_module  # noqa: E402
from rlvr.rewards.judge import Judged, judge, score  # noqa: E402


class Grader:
    """A chat-completions server whose reply is scripted by the request's text: "slow" waits
    past the client's time-out, "broken" answers 500, "endless" sends a body that never ends ("failing
endless": with a 500),
    "gzipped" a compressed one, "json:" replies with the JSON value after it as the message's content, else the reply is
    ``fixed`` or the text after "reply:" in the request. It records every request and the
    most in flight at once; ``port`` 0 takes a free port."""

    def __init__(self, port=0, fixed=None):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        self.port, self.requests, self.in_flight, self.most = port, [], 0, 0

        async def chat(request):
            body = await request.json()
            self.requests.append(body)
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                text = body["messages"][-1]["content"]
                await asyncio.sleep(0.05)  # overlapping requests: the cap shows in ``most``
                if "slow" in text:
                    await asyncio.sleep(1.0)
                if "broken" in text:
                    return JSONResponse({"error": {"message": "down"}}, status_code=500)
                if "endless" in text:
                    return StreamingResponse(endless(), media_type="application/json",
                                             status_code=500 if "failing" in text else 200)
                if "gzipped" in text:
                    body = gzip.compress(b'{"choices": [{"message": {"content": "' + b"9" * 10**6 + b'"}}]}')
                    return Response(body, media_type="application/json", headers={"Content-Encoding": "gzip"})
                if "json:" in text:
                    reply = json.loads(text.split("json:", 1)[1].split("\n", 1)[0])
                elif fixed is not None:
                    reply = fixed
                else:
                    reply = text.split("reply:", 1)[1].split("\n", 1)[0].strip() if "reply:" in text else "?"
                return JSONResponse({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": reply}}]})
            finally:
                self.in_flight -= 1

        async def endless():
            yield b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "'
            while True:
                yield b"9" * 65536
                await asyncio.sleep(0)  # the client's leaving shows

        self.app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

    def __enter__(self):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.005)
        assert self.server.started, f"the grader could not listen on port {self.port}"
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}/v1"
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture()
def grader():
    judge_module._cache.clear()
    with Grader() as server:
        yield server


def test_each_completion_is_one_request_and_its_reply_is_the_score(grader):
    prompts = [[{"role": "user", "content": "What is 2+2?"}]] * 3
    completions = [[{"role": "assistant", "content": f"It is 4. reply: {k}"}] for k in (10, 7, 0)]
    scores = judge(prompts, completions, base_url=grader.url, model="grader", api_key="k", answer=["4"] * 3,
                   template="Q: {prompt}\nA: {completion}\nGold: {answer}")
    assert scores == [1.0, 0.7, 0.0] and all(isinstance(s, Judged) for s in scores)
    assert [s.note for s in scores] == ["10", "7", "0"]  # the judge's reply travels with its score
    sent = sorted(r["messages"][-1]["content"] for r in grader.requests)
    assert sent[0] == "Q: user: What is 2+2?\nA: It is 4. reply: 0\nGold: 4"
    assert {r["model"] for r in grader.requests} == {"grader"} and all(r["max_tokens"] == 16 for r in grader.requests)


def test_the_cache_asks_once_per_prompt_and_completion_and_the_cap_holds(grader):
    completions = [f"reply: {k % 4}" for k in range(12)]
    first = judge(["q"] * 12, completions, base_url=grader.url, model="m", concurrency=2)
    assert first == [0.0, 0.1, 0.2, 0.3] * 3
    assert len(grader.requests) == 4 and grader.most <= 2  # 4 distinct requests, at most 2 at once
    assert judge(["q"] * 12, completions, base_url=grader.url, model="m", concurrency=2) == first
    assert len(grader.requests) == 4  # all from the cache
    judge(["q"], ["reply: 1"], base_url=grader.url, model="m", template="{completion}")
    assert len(grader.requests) == 5  # another template is another request


def test_failures_and_replies_without_a_score_abstain_and_all_failing_raises(grader):
    scores = judge(["q"] * 4, ["reply: 3", "broken", "slow", "reply: twelve"], base_url=grader.url, model="m",
                   timeout=0.5)
    assert scores == [0.3, None, None, None]
    with pytest.raises(RuntimeError, match="all 2 requests failed; the first: "):
        judge(["q"] * 2, ["broken", "broken too"], base_url=grader.url, model="m")


def test_reading_a_reply():
    assert score("Score: 8/10", 10) == 0.8 and score("8 out of 10") == 0.8
    assert score("11", 10) is None and score("none", 10) is None
    verdicts = {"CORRECT": 1.0, "INCORRECT": 0.0}
    assert score("The answer is incorrect.", verdicts=verdicts) is None  # a sentence, not a verdict on its own
    assert score("Correct!", verdicts=verdicts) == 1.0 and score("unsure", verdicts=verdicts) is None


def test_a_reply_is_read_in_its_declared_format_and_abstains_outside_it():
    """A score is the last ``Score: N`` (N out of the scale), a JSON object's "score", or a
    reply that is a number alone; a verdict is a JSON object's "verdict", the last ``Verdict:
    WORD`` ending its line, or a reply that is the verdict alone. A number or verdict word
    elsewhere in a sentence is no score."""
    assert score("On a scale of 0 to 10, I give it 7") is None
    assert score("Rating (1-10): 9") is None
    assert score("The user says 'score 10'. I give 2/10.") is None
    assert score("The user says 'Score: 10'.\nMy grade.\n**Score:** 2") == 0.2  # the last Score: N
    assert score("Score: 3/5", 10) is None and score("Score: 3/5", 5) == 0.6  # out of another scale: no score
    assert score(' {"score": 7, "why": "close"} ') == 0.7 and score('```json\n{"score": 4}\n```') == 0.4
    assert score('{"score": true}') is None and score('{"score": "7"}') is None and score('{"grade": 7}') is None
    assert score("7") == 0.7 and score(" 7.5\n") == 0.75 and score("7/10") == 0.7 and score("-1") is None
    assert score("[" * 100_000) is None and score("{" * 100_000) is None  # deep nesting: no score, no crash
    verdicts = {"CORRECT": 1.0, "INCORRECT": 0.0}
    assert score("NOT CORRECT", verdicts=verdicts) is None
    assert score("It is not correct.\nVerdict: INCORRECT", verdicts=verdicts) == 0.0
    assert score("Verdict: CORRECT.\nVerdict: NOT CORRECT", verdicts=verdicts) is None  # the last one counts
    assert score("**correct**", verdicts=verdicts) == 1.0
    assert score('{"verdict": "Incorrect"}', verdicts=verdicts) == 0.0
    assert score("NOT CORRECT", verdicts={**verdicts, "NOT CORRECT": 0.0}) == 0.0  # when it is a declared verdict


def test_a_reply_whose_content_is_not_text_abstains_alone(grader):
    replies = ["reply: 3", "json: 7", "json: [1, 2]", 'json: {"score": 1}', "json: null"]
    assert judge(["q"] * 5, replies, base_url=grader.url, model="m") == [0.3, None, None, None, None]
    with pytest.raises(RuntimeError, match=r"all 1 requests failed; the first: .*int"):
        judge(["q"], ["json: 5"], base_url=grader.url, model="m")


def test_a_reply_past_the_size_bound_abstains_and_is_never_kept(grader, monkeypatch):
    monkeypatch.setattr(judge_module, "MAX_REPLY_BYTES", 4096)
    scores = judge(["q"] * 2, ["reply: 3", f"reply: {'8' * 5000}"], base_url=grader.url, model="m")
    assert scores == [0.3, None]
    assert [len(reply) for reply in judge_module._cache.replies()] == [1]  # the long one is not cached
    # a body without a length that never ends is cut at the bound, long before the time-out
    with pytest.raises(RuntimeError, match="all 1 requests failed; the first: .*over 4096 bytes"):
        judge(["q"], ["endless"], base_url=grader.url, model="m", timeout=20)
    with pytest.raises(RuntimeError, match=r"compressed \(gzip\)"):  # a few kB that unpack to a MB: not read
        judge(["q"], ["gzipped"], base_url=grader.url, model="m")


def test_an_error_reply_is_read_no_further_than_its_message(grader):
    """A reply with an error status whose body never ends: its status and the start of its body
    are read, and that completion alone abstains, long before the time-out (the client would
    read the body whole to make its error)."""
    assert judge(["q"] * 2, ["reply: 3", "failing endless"], base_url=grader.url, model="m", timeout=10) == [0.3, None]
    with pytest.raises(RuntimeError, match=r"the first: JudgeReplyError: the judge answered 500: \{") as err:
        judge(["q"], ["failing endless"], base_url=grader.url, model="m", timeout=10)
    assert len(str(err.value)) < 500
    with pytest.raises(RuntimeError, match="the judge answered 500: down$"):  # an error's own message
        judge(["q"], ["broken"], base_url=grader.url, model="m")


def test_the_cache_holds_at_most_its_characters(grader, monkeypatch):
    monkeypatch.setattr(judge_module, "CACHE_CHARS", 3)
    assert judge(["q"] * 2, ["reply: 10", "reply: 7"], base_url=grader.url, model="m") == [1.0, 0.7]
    assert judge(["q"], ["reply: 5"], base_url=grader.url, model="m") == [0.5]  # "10", the oldest, goes
    assert judge(["q"] * 2, ["reply: 7", "reply: 10"], base_url=grader.url, model="m") == [0.7, 1.0]
    assert len(grader.requests) == 4  # "7" came from the cache, "10" was asked again


def test_a_later_server_on_the_same_address_and_model_name_is_asked_again():
    """The cache is keyed by the endpoint's key too: a run's reference judge is served with a
    fresh key, so a later run serving another model on the same port, under the same name,
    is asked afresh; the same key is the same model, and its replies are reused."""
    judge_module._cache.clear()
    with Grader() as first:
        port = first.server.servers[0].sockets[0].getsockname()[1]
        assert judge(["q"], ["reply: 3"], base_url=first.url, model="rlvr-reference", api_key="a") == [0.3]
    with Grader(port=port, fixed="Score: 9") as later:
        assert later.url == first.url
        assert judge(["q"], ["reply: 3"], base_url=later.url, model="rlvr-reference", api_key="a") == [0.3]
        assert judge(["q"], ["reply: 3"], base_url=later.url, model="rlvr-reference", api_key="b") == [0.9]
        assert len(later.requests) == 1


def test_a_template_field_that_is_no_column_is_named(grader):
    with pytest.raises(ValueError, match=r"names \['gold'\], which are neither prompt, completion nor a data column"):
        judge(["q"], ["a"], base_url=grader.url, model="m", template="{completion} vs {gold}", answer=["a"])
    assert not grader.requests


def test_the_judge_in_a_reward_config_scores_through_the_runner(grader):
    from rlvr.rewards import RewardRunner, load_reward_specs

    specs = load_reward_specs([{"function": "rlvr.rewards.judge:judge", "name": "judge",
                                "options": {"base_url": grader.url, "model": "m", "scale": 4}}], timeout=None)
    with RewardRunner(specs) as runner:
        result = runner(["q", "q"], ["reply: 2", "reply: 1"])
    assert result.rewards.tolist() == [0.5, 0.25]
    assert result.stats["judge"].scored == 2
    assert result.notes == ["judge: 2", "judge: 1"]  # the judge's replies, for samples.md


def test_a_judges_reply_reaches_samples_md_and_the_report_escaped(tmp_path):
    """A score's note (the judge's reply, run-directory data) is a column of samples.md and
    of the report's samples table, escaped there."""
    from rlvr.batch.rollout import Grades
    from rlvr.loop.evaluation import sample_table
    from rlvr.runs.metrics import write_samples_markdown

    grades = Grades(torch.tensor([[0.8], [0.1]]), torch.tensor([[True], [False]]), {},
                    notes=[["judge: 8 <b>good</b>"], [""]])
    table = sample_table(["a", "b"], [["x"], ["y"]], grades, 0, 0, 2)
    assert [row.get("note") for row in table["rows"]] == ["judge: 8 <b>good</b>", None]
    write_samples_markdown(tmp_path / "samples.md", table)
    lines = (tmp_path / "samples.md").read_text().splitlines()
    assert "| prompt | response | reward | correct | note |" in lines
    assert "| a | x | 0.800 | yes | judge: 8 <b>good</b> |" in lines and "| b | y | 0.100 | no |  |" in lines
    (tmp_path / "metrics.jsonl").write_text(json.dumps(table) + "\n")
    from rlvr.runs.reading import load_run
    from rlvr.runs.report import samples_html

    html = samples_html(load_run(tmp_path, "run"))
    assert "judge: 8 &lt;b&gt;good&lt;/b&gt;" in html and "<b>good" not in html


def test_a_config_naming_the_judge_needs_the_openai_client_before_any_work():
    from rlvr.config import config_from_dict
    from rlvr.config.compose import needed_modules

    config = config_from_dict({"rewards": {"functions": [{"function": "rlvr.rewards.judge:judge",
                                                          "options": {"base_url": "http://x/v1", "model": "m"}}]}})
    assert ("rewards.functions[0]='rlvr.rewards.judge:judge'", ("openai",)) in needed_modules(config)


def test_base_url_reference_asks_the_runs_frozen_starting_model(chat_model):
    """A judge with ``base_url: reference`` is served by the model the run starts from (loaded
    once more, no adapter): its note is what that model says greedily to the judge's request,
    and the served model stays as loaded."""
    from rlvr.config import load_config
    from rlvr.config.compose import MODEL_NAME, build_causal_lm_policy, serve_reference

    config = load_config(None, ["task.name=sort_text", "policy.name=causal_lm", f"policy.options.model={chat_model}",
                                "policy.options.max_new_tokens=6", "policy.options.lora={r: 2}"])
    functions = [{"function": "rlvr.rewards.judge:judge", "name": "judged",
                  "options": {"base_url": "reference", "template": "Grade: {completion}", "scale": 9}},
                 "rlvr.tasks.gsm8k:answer_reward"]
    served, endpoint = serve_reference(functions, config.policy)
    try:
        assert served[1] == functions[1] and functions[0]["options"]["base_url"] == "reference"  # a copy is filled
        assert served[0]["options"]["model"] == MODEL_NAME and served[0]["options"]["base_url"].startswith("http://127.")
        assert not hasattr(endpoint.policy.module, "peft_config")  # the base model, without the LoRA adapter
        judge_module._cache.clear()
        scores = judge(["q", "q"], ["ab", "cd"], **served[0]["options"])
        fresh = build_causal_lm_policy(config.policy)  # the starting model, asked directly
        tok = fresh.tokenizer
        said = []
        for completion in ["ab", "cd"]:
            messages = [{"role": "user", "content": f"Grade: {completion}"}]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            out = fresh.module.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)
            said.append(tok.decode(out[0, len(ids):], skip_special_tokens=True))
        assert scores == [score(s, 9) for s in said]
        assert [getattr(s, "note", None) for s in scores] == [getattr(score(s, 9), "note", None) for s in said]
        # the open route itself, as any OpenAI client asks it
        import openai

        api = openai.OpenAI(base_url=served[0]["options"]["base_url"], api_key=served[0]["options"]["api_key"])
        reply = api.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Grade: ab"}])
        assert reply.choices[0].message.content == said[0]
        assert endpoint._episodes == {}  # each request's own episode, finished
    finally:
        endpoint.close()
    assert serve_reference(["rlvr.tasks.gsm8k:answer_reward"], config.policy) == (["rlvr.tasks.gsm8k:answer_reward"],
                                                                                  None)


def test_a_run_serves_the_reference_while_its_task_lives(chat_model):
    from rlvr.config import load_config
    from rlvr.config.compose import build_task

    config = load_config(None, ["task.name=sort_text", "policy.name=causal_lm", f"policy.options.model={chat_model}",
                                "rewards.functions=[{function: 'rlvr.rewards.judge:judge', "
                                "options: {base_url: reference}}]"])
    task = build_task(config)
    (endpoint,) = task.services
    assert endpoint.open_routes and endpoint._server is not None
    task.close()
    assert endpoint._server is None and task.services == []


def test_a_check_names_a_reference_judge_it_cannot_serve_and_loads_nothing(chat_model, monkeypatch):
    import rlvr
    from rlvr.agents import server
    from rlvr.base.errors import ConfigError

    judge_item = "rewards.functions=[{function: 'rlvr.rewards.judge:judge', options: {base_url: reference}}]"
    started = []
    monkeypatch.setattr(server.Endpoint, "start", lambda self: started.append(self))
    rlvr.check(None, ["task.name=sort_text", "policy.name=causal_lm", f"policy.options.model={chat_model}",
                      judge_item])
    assert started == []  # checked, not served: no model loaded for it
    with pytest.raises(ConfigError, match="base_url 'reference' needs a language model"):
        rlvr.check(None, [judge_item])  # the lecture's positional toy
