import random
import re

import verifiers.v1 as vf
from verifiers.v1.types import content_text


class ArithmeticData(vf.TaskData):
    """One question and its answer."""

    answer: int


class ArithmeticTask(vf.Task[ArithmeticData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the last number of the model's last reply is the answer."""
        numbers = re.findall(r"-?\d+", content_text(trace.last_message.content))
        return float(bool(numbers) and int(numbers[-1]) == self.data.answer)


class ArithmeticConfig(vf.TasksetConfig):
    num_tasks: int = 64
    """How many questions."""
    min_operand: int = 10
    max_operand: int = 99
    """Operands are drawn from min_operand to max_operand."""
    seed: int = 0


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def load(self) -> list[ArithmeticTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = (rng.randint(self.config.min_operand, self.config.max_operand) for _ in range(2))
            data = ArithmeticData(prompt=f"What is {a} + {b}? Reply with only the number.", answer=a + b)
            tasks.append(ArithmeticTask(data, self.config.task))
        return tasks
