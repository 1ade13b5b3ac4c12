import random
import re

import verifiers.v1 as vf
from verifiers.v1.types import content_text


class FollowupData(vf.TaskData):
    """The opening question, the number the user then asks to add, and the final answer."""

    add: int
    answer: int


class FollowupTask(vf.Task[FollowupData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the last number of the model's last reply is the sum with the added number."""
        numbers = re.findall(r"-?\d+", content_text(trace.last_message.content))
        return float(bool(numbers) and int(numbers[-1]) == self.data.answer)


class FollowupConfig(vf.TasksetConfig):
    num_tasks: int = 64
    """How many questions."""
    max_operand: int = 9
    """Operands (and the added number) are drawn from 0 to max_operand."""
    seed: int = 0


class FollowupTaskset(vf.Taskset[FollowupTask, FollowupConfig]):
    def load(self) -> list[FollowupTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b, add = (rng.randint(0, self.config.max_operand) for _ in range(3))
            data = FollowupData(prompt=f"What is {a} + {b}? Reply with only the number.", add=add,
                                answer=a + b + add)
            tasks.append(FollowupTask(data, self.config.task))
        return tasks


class FollowupEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    """The one seat: the policy."""


class FollowupEnv(vf.Env[FollowupEnvConfig]):
    """The user's side: the task's prompt opens, the model answers, then the user asks for
    the number added; the model's second reply is the one scored."""

    async def run(self, task: FollowupTask, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            if not segment.terminated:
                await interaction.turn(f"Now add {task.data.add} to your answer. Reply with only the number.")
