"""Write the chat-arithmetic recipe's data: "What is a + b? Reply with only the number."

Sums of two-digit operands (10-99), every question once: 1,600 training rows and 256 held-out
rows, disjoint, from a fixed seed (the files are checked in; this script remakes them byte for
byte). Sums only: SmolLM2-135M-Instruct's greedy "a + b = c" is right for about 1 question in
5 (its differences of two-digit numbers, often negative, far less), and what RL can teach it
here is to answer with the number alone, which it never does before training.

    python examples/data/make_chat_arithmetic.py
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def rows(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    questions = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    chosen = rng.sample(questions, 1600 + 256)
    return [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
             "answer": str(a + b)} for a, b in chosen]


def main() -> None:
    data = rows()
    for name, part in (("chat_arithmetic_train.jsonl", data[:1600]), ("chat_arithmetic_eval.jsonl", data[1600:])):
        (HERE / name).write_text("".join(json.dumps(row) + "\n" for row in part))


if __name__ == "__main__":
    main()
