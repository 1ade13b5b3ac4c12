"""The agent endpoint's overhead: E concurrent episodes through HTTP against the same
episodes run directly on the engine, and whether the recorded tokens are identical.

Each episode is two calls: a chat question, then the same conversation with the reply
and a follow-up question (the second call's prompt is the first's prompt and completion
and the template's delta, as the endpoint builds it). Through the endpoint, E agents
(``openai.AsyncOpenAI``) run at once; directly, the same prompts go to the engine in one
batch per call (``rlvr.policies.turns.next_turns``) with the same per-completion seeds
(``rlvr.agents.batcher.call_seed``). Wall time of each side, repeated, interleaved; the
script prints the medians, endpoint / direct - 1 (the overhead; goal: at most 10 %), and
whether every recorded completion equals the direct one token for token.

    python benchmarks/endpoint.py                                   # SmolLM2-135M-Instruct, E = 32
    python benchmarks/endpoint.py --model tiny --repeats 3          # a random character model
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import string
import tempfile
import time
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model (or 'tiny': a random one)")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def question(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is {10 + i} + {i * 7 % 90}? Reply with the number."}]


FOLLOW_UP = {"role": "user", "content": "Are you sure? Say it again."}


def through_endpoint(endpoint, episodes: int, new_tokens: int) -> list[list[list[int]]]:
    """Every episode's completions as the endpoint recorded them."""
    import openai

    async def agent(i: int, shared) -> None:
        client = openai.AsyncOpenAI(base_url=endpoint.url(ids[i]), api_key=endpoint.key(ids[i]), max_retries=0,
                                    http_client=shared)
        messages = question(i)
        reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=new_tokens)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), FOLLOW_UP]
        await client.chat.completions.create(model="m", messages=messages, max_tokens=new_tokens)

    async def run() -> None:
        async with openai.DefaultAsyncHttpxClient() as shared:  # one connection pool, as rlvr's runner keeps
            await asyncio.gather(*(agent(i, shared) for i in range(episodes)))

    ids = [endpoint.open(seed=1000 + i, temperature=1.0, max_tokens=4 * new_tokens + 64) for i in range(episodes)]
    asyncio.run(run())
    return [[c.completion_ids for c in endpoint.finish(i).calls] for i in ids]


def direct(policy, episodes: int, new_tokens: int) -> list[list[list[int]]]:
    """The same episodes on the engine: each call one batch, the same seeds and prompt ids."""
    from rlvr.agents.batcher import call_seed
    from rlvr.policies import turns
    from rlvr.policies.prompts import prompt_token_ids

    tok = policy.tokenizer
    prompts = prompt_token_ids(tok, [question(i) for i in range(episodes)], False, new_tokens, policy.max_positions)
    eos = tok(tok.eos_token, add_special_tokens=False)["input_ids"]
    completions: list[list[list[int]]] = [[] for _ in range(episodes)]
    for call in range(2):
        seeds = torch.tensor([call_seed(1000 + i, call) for i in range(episodes)], dtype=torch.long)
        with torch.no_grad():
            generation, texts = turns.next_turns(policy, prompts, 1.0, new_tokens, seeds)
        lengths, ids = generation.lengths.tolist(), generation.response_ids.tolist()
        for i in range(episodes):
            completions[i].append(ids[i][:lengths[i]])
        if call == 0:
            nxt = []
            for i in range(episodes):
                done = completions[i][0]
                closing = [] if done and tok.decode(done[-1:]) == tok.eos_token else eos
                history = [*question(i), {"role": "assistant", "content": texts[i]}]
                _, delta = turns.observation_ids(policy, history, [FOLLOW_UP])
                nxt.append(prompts[i] + done + closing + delta)
            prompts = nxt
    return completions


def load(model: str, new_tokens: int):
    from rlvr.policies.causal_lm import CausalLMPolicy

    if model != "tiny":
        from rlvr.policies.hf_model import locate_model

        return CausalLMPolicy.from_pretrained(str(locate_model(model)), max_new_tokens=new_tokens)
    from transformers import AutoTokenizer

    from rlvr.modeling import init_model

    folder = Path(tempfile.mkdtemp()) / "model"
    chars = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")
    init_model(folder, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, chars=chars,
               max_positions=1024)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    tok.save_pretrained(folder)
    return CausalLMPolicy.from_pretrained(str(folder), max_new_tokens=new_tokens)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from rlvr.agents.server import Endpoint

    policy = load(args.model, args.new_tokens)
    endpoint = Endpoint(policy)
    endpoint.start()
    served, ran, same, calls = [], [], True, []
    try:
        through_endpoint(endpoint, min(args.episodes, 4), args.new_tokens)  # warm both paths up
        direct(policy, min(args.episodes, 4), args.new_tokens)
        for _ in range(args.repeats):
            start, before = time.perf_counter(), endpoint._batcher.calls
            recorded = through_endpoint(endpoint, args.episodes, args.new_tokens)
            served.append(time.perf_counter() - start)
            calls.append(endpoint._batcher.calls - before)
            start = time.perf_counter()
            expected = direct(policy, args.episodes, args.new_tokens)
            ran.append(time.perf_counter() - start)
            same &= recorded == expected
    finally:
        endpoint.close()
    s, d = statistics.median(served), statistics.median(ran)
    print(f"{args.model}: {args.episodes} episodes of 2 calls, up to {args.new_tokens} new tokens a call, "
          f"{args.threads} threads, {args.repeats} repeats (wall seconds)")
    print(f"  through the endpoint {s:.2f} s ({', '.join(f'{x:.2f}' for x in served)}); engine calls per repeat "
          f"{', '.join(map(str, calls))} (2: each of the episodes' two calls in one batch)")
    print(f"  direct on the engine {d:.2f} s ({', '.join(f'{x:.2f}' for x in ran)})")
    print(f"  overhead {s / d - 1:+.1%} (goal: at most +10%)")
    print(f"  recorded tokens identical to the direct run's: {same}")


if __name__ == "__main__":
    main()
