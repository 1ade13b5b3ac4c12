"""An agent written only against the openai client: it asks the model for the sum of two
5-digit numbers, runs the calculator the model calls, and asks again with the result.

The protocol is the one the tiny model of examples/calculator_sft.yaml was shown: the
prompt "12345+67890=", a reply that calls "calculator(12345+67890)", the agent's
"= 80235" line after it, then a reply with the answer. rlvr serves the policy behind
`client` (task.name: agent, examples/agent_tiny.yaml); the same code runs against any
OpenAI-compatible completions endpoint.
"""

import re

CALL = re.compile(r"calculator\((\d+)\+(\d+)\)")


async def run(client, row):
    """Up to three model calls; the reward is 1 when the final reply is the sum."""
    text = f"{row['a']}+{row['b']}="
    for _ in range(3):
        reply = await client.completions.create(model="policy", prompt=text, max_tokens=24)
        said = reply.choices[0].text
        call = CALL.search(said)
        if call is None:  # no tool call: this is the answer
            right = said.strip() == str(row["a"] + row["b"])
            return {"reward": float(right), "solved": right, "tool_calls": float(text.count("calculator("))}
        text += said + f"= {int(call.group(1)) + int(call.group(2))}\n"  # the tool's result, as the model was shown
    return {"reward": 0.0, "solved": False, "tool_calls": float(text.count("calculator("))}
