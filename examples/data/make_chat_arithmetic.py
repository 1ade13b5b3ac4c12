"""Write the chat-arithmetic recipe's data: "What is a + b? Reply with only the number."

Sums of two-digit operands (10-99): 1,600 training rows and 256 held-out rows from a fixed
seed (the files are checked in; this script remakes them byte for byte). The split is by
unordered pair: a held-out "a + b" has neither "a + b" nor "b + a" in training (the same sum,
the same digits), and no two held-out rows share a pair. Sums only: SmolLM2-135M-Instruct's
greedy "a + b = c" is right for about 1 question in 5 (its differences of two-digit numbers,
often negative, far less), and what RL can teach it here is to answer with the number alone,
which it never does before training.

    python examples/data/make_chat_arithmetic.py
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
NUM_TRAIN, NUM_EVAL = 1600, 256


def question(a: int, b: int) -> dict:
    return {"prompt": [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
            "answer": str(a + b)}


def split(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): the held-out rows are NUM_EVAL distinct unordered pairs,
    each in a random order; the training rows are NUM_TRAIN distinct ordered questions on the
    other pairs."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 100) for b in range(a, 100)]
    held_out = rng.sample(pairs, NUM_EVAL)
    eval_pairs = set(held_out)
    ordered = [(a, b) for a in range(10, 100) for b in range(10, 100) if (min(a, b), max(a, b)) not in eval_pairs]
    train = rng.sample(ordered, NUM_TRAIN)
    held_out = [(b, a) if rng.random() < 0.5 else (a, b) for a, b in held_out]
    return [question(a, b) for a, b in train], [question(a, b) for a, b in held_out]


def main() -> None:
    train, held_out = split()
    for name, part in (("chat_arithmetic_train.jsonl", train), ("chat_arithmetic_eval.jsonl", held_out)):
        (HERE / name).write_text("".join(json.dumps(row) + "\n" for row in part))


if __name__ == "__main__":
    main()
