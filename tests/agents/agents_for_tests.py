"""Agents the tests train: written only against the openai client."""

import asyncio


async def two_calls(client, row):
    """Ask, get a tool's answer back, answer again: two model calls that join into one sequence.
    Solved when the final reply holds the row's digit."""
    messages = [{"role": "user", "content": f"Say {row['digit']}."}]
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
    second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    right = str(row["digit"]) in (second.choices[0].message.content or "")
    return {"reward": float(right), "solved": right, "replies": 2}


def plain_agent(client, row):
    """A synchronous agent with the plain OpenAI client; the reward is the first reply's length over 8."""
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    return len(reply.choices[0].message.content or "") / 8


async def fails_on_odd(client, row):
    """Raises for odd digits, after one call."""
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    if row["digit"] % 2:
        raise RuntimeError(f"odd digit {row['digit']}")
    return 1.0


async def always_fails(client, row):
    raise ValueError("no tools today")


async def hangs(client, row):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    await asyncio.sleep(3600)


async def rewrites(client, row):
    """Two calls, the second after a rewritten history (a summary instead of the first
    exchange): two segments, each trained with the episode's reward."""
    first = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi."}],
                                                 max_tokens=4)
    summary = f"Earlier you said: {first.choices[0].message.content!r}. Say {row['digit']}."
    second = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": summary}],
                                                  max_tokens=4)
    right = str(row["digit"]) in (second.choices[0].message.content or "")
    return {"reward": float(right), "solved": right}
