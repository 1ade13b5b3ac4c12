"""Chat templates rendered turn by turn against whole: the delta's exact text, and the
check finding a planted inconsistency (Qwen3-like <think> dropping, a last assistant turn
rendered unlike the generation prompt) at its first difference, and none where there is
none."""

import string

import pytest

from rlvr.modeling import build_char_tokenizer
from rlvr.policies.chat_check import ChatTemplateMismatch, check_chat_template, check_turn_end, render_delta

# ChatML-like: every message "<|role|>\n{content}<eos>\n", the generation prompt "<|assistant|>\n".
CONSISTENT = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Like Qwen3: an assistant turn before the last user message loses its "<think>...</think>" part.
DROPS_THINKING = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in m.content %}"
    "{% set content = m.content.split('</think>')[-1] %}{% else %}{% set content = m.content %}{% endif %}"
    "<|{{ m.role }}|>\n{{ content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# The generation prompt "<|assistant|>\n", but assistant turns rendered "<|assistant|> ".
ASSISTANT_HEADER_DIFFERS = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|assistant|> {% else %}<|{{ m.role }}|>\n{% endif %}"
    "{{ m.content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

THINKING = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "<think>add</think>4"},
    {"role": "user", "content": "times 3?"},
    {"role": "assistant", "content": "12"},
]
TOOLS = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "guess"},
    {"role": "assistant", "content": "5"},
    {"role": "tool", "content": "higher"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "7"},
    {"role": "tool", "content": "correct"},
]


def tokenizer(template=None):
    tok = build_char_tokenizer(string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", ""))
    if template is not None:
        tok.chat_template = template
    return tok


def test_render_delta_is_the_text_after_the_policys_end_of_turn():
    tok = tokenizer(CONSISTENT)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    new = [{"role": "tool", "content": "42"}]
    delta = render_delta(tok, messages, new)
    # The policy sampled "yo<eos>"; the template's "\n" after it is the delta's first character.
    assert delta == "\n<|tool|>\n42<eos>\n<|assistant|>\n"
    prompt = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template(messages + new, tokenize=False, add_generation_prompt=True)
    assert prompt + "yo<eos>" + delta == whole
    # Token in, token out: with a character tokenizer the appended ids are the delta's ids.
    assert tok.encode(prompt + "yo<eos>", add_special_tokens=False) + tok.encode(delta, add_special_tokens=False) \
        == tok.encode(whole, add_special_tokens=False)


def test_render_delta_with_a_given_end_of_turn():
    tok = tokenizer(CONSISTENT.replace("{{ eos_token }}", "<|im_end|>"))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    delta = render_delta(tok, messages, [{"role": "user", "content": "ok"}], end_of_turn="<|im_end|>")
    assert delta == "\n<|user|>\nok<|im_end|>\n<|assistant|>\n"
    # With the eos_token default ("<eos>"), the template writes no end of turn to cut at.
    with pytest.raises(ValueError, match="no end-of-turn text '<eos>'"):
        render_delta(tok, messages, [{"role": "user", "content": "ok"}])


def test_render_delta_raises_at_the_first_difference():
    tok = tokenizer(DROPS_THINKING)
    with pytest.raises(ChatTemplateMismatch) as raised:
        render_delta(tok, THINKING[:2], THINKING[2:3])
    # Turn by turn: "<|user|>\n2+2?<eos>\n<|assistant|>\n<think>add</think>4<eos>"; whole: "...\n4<eos>\n<|user|>"
    at = len("<|user|>\n2+2?<eos>\n<|assistant|>\n")
    assert raised.value.position == at
    assert "<think>" in raised.value.turn_by_turn and "<think>" not in raised.value.whole
    assert isinstance(raised.value, ValueError)
    assert f"at character {at}" in str(raised.value)


def test_render_delta_refuses_messages_not_ending_with_an_assistant_turn():
    with pytest.raises(ValueError, match="must end with an assistant turn, not 'user'"):
        render_delta(tokenizer(CONSISTENT), THINKING[:1], THINKING[2:3])


def test_a_consistent_template_has_no_difference():
    tok = tokenizer(CONSISTENT)
    assert check_chat_template(tok, [THINKING, TOOLS, THINKING[:2], [{"role": "user", "content": "x"}]]) == []


def test_the_check_finds_the_dropped_thinking_at_its_first_difference():
    tok = tokenizer(DROPS_THINKING)
    # Conversation 0 has no <think> to drop: consistent; conversation 1 has.
    differences = check_chat_template(tok, [TOOLS, THINKING])
    assert len(differences) == 1
    at = len("<|user|>\n2+2?<eos>\n<|assistant|>\n")
    assert differences[0].startswith(f"conversation 1, message 2 (user): at character {at}: turn by turn ")
    # 40 characters of each side from 20 before the difference (character 13 on), as reprs.
    turn_by_turn = "<|user|>\n2+2?<eos>\n<|assistant|>\n<think>add</think>4<eos>"[13:53]
    whole = "<|user|>\n2+2?<eos>\n<|assistant|>\n4<eos>\n<|user|>\ntimes 3?<eos>\n<|assistant|>\n"[13:53]
    assert differences[0] == (f"conversation 1, message 2 (user): at character {at}: "
                              f"turn by turn ...{turn_by_turn!r}..., whole ...{whole!r}...")
    assert "<think>add" in turn_by_turn and "<think>" not in whole


def test_the_check_finds_a_last_assistant_turn_rendered_unlike_the_generation_prompt():
    tok = tokenizer(ASSISTANT_HEADER_DIFFERS)
    differences = check_chat_template(tok, [TOOLS])
    # The system and user messages, then "<|assistant|>" + "\n" (sampled after the prompt) vs " " (whole).
    at = len("<|system|>\nbe brief<eos>\n<|user|>\nguess<eos>\n<|assistant|>")
    assert len(differences) == 1
    assert differences[0].startswith(f"conversation 0, message 2 (assistant): at character {at}: ")
    assert differences[0].endswith("<|assistant|>\\n5<eos>', whole ...'<|user|>\\nguess<eos>\\n<|assistant|> 5<eos>'")


def test_the_check_stops_at_its_limit():
    tok = tokenizer(DROPS_THINKING)
    differences = check_chat_template(tok, [TOOLS, THINKING, THINKING, THINKING], limit=2)
    assert [d.split(",")[0] for d in differences] == ["conversation 1", "conversation 2"]


def test_without_a_chat_template_there_is_nothing_to_check():
    tok = tokenizer()
    assert check_chat_template(tok, [THINKING]) == []
    with pytest.raises(ValueError, match="no chat template"):
        render_delta(tok, THINKING[:2], THINKING[2:3])


# Every message's content and "=", and no end of turn after any of them.
NO_END_OF_TURN = "{% for m in messages %}{{ m.content }}={% endfor %}"


def test_a_template_without_an_end_of_turn_is_found_on_a_short_conversation():
    with pytest.raises(ValueError, match=r"^the chat template writes no end-of-turn text '<eos>' .* after an assistant "
                                         r"turn \(it renders 'Which turn is this\?=The first.='\); set policy"):
        check_turn_end(tokenizer(NO_END_OF_TURN))
    check_turn_end(tokenizer(CONSISTENT))
    check_turn_end(tokenizer(CONSISTENT.replace("{{ eos_token }}", "<|im_end|>")), end_of_turn="<|im_end|>")
    check_turn_end(tokenizer())  # no template: nothing rendered, nothing to check


def test_an_agent_run_refuses_a_template_without_an_end_of_turn_before_any_work(chat_model, tmp_path, monkeypatch,
                                                                              capsys):
    """The agent's second call would find it (an error at that call, in the middle of the run):
    the run stops before the endpoint serves anything, with one line."""
    from pathlib import Path

    from rlvr.cli import main

    pytest.importorskip("openai")
    pytest.importorskip("starlette")
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "agents"))  # agents_for_tests
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"digit": {d}}}\n' for d in range(4)))
    out = tmp_path / "run"
    code = main(["train", f"out_dir={out}", "task.name=agent", "task.options.agent=agents_for_tests:two_calls",
                 f"task.options.data={data}", "task.options.eval_size=2", "task.options.max_tokens=64",
                 "task.prompts_per_epoch=2", "policy.name=causal_lm", f"policy.options.model={chat_model}",
                 f"policy.options.chat_template='{NO_END_OF_TURN}'", "policy.options.max_new_tokens=4",
                 "algo.group_size=2", "algo.epochs=1", "log.progress=false", "log.plot=false"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0, err
    assert err.startswith("rlvr: error: an agent's calls go on after the policy's turn, and the chat template writes "
                          "no end-of-turn text '<eos>'"), err
    assert err.endswith("set policy.options.chat_template to a template that ends each assistant turn with it"), err
    assert not (out / "metrics.jsonl").exists()
