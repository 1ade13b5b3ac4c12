"""Reward functions in the TRL form, how several combine, and how they run safely.

A reward function scores N = B*G completions at once (the form TRL's GRPOTrainer
calls, so functions move between the two)::

    fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]

``columns`` are the prompt dicts' other keys (e.g. ``answer=[...]``), each a list of
length N aligned with ``completions``. Everything is passed by keyword, as TRL does, so
a function names the arguments and columns it needs and takes ``**kwargs`` for the rest
(``def f(completions, **kwargs)`` works). ``None`` abstains: the function has no opinion
on that completion (multi-task data, a grader that does not apply).

As in TRL, a chat prompt (a list of ``{"role", "content"}`` messages) comes with its
completion as a list of one assistant message, ``[{"role": "assistant", "content":
text}]``, and in a run every function also gets ``completion_ids`` (each completion's
token ids) and ``trainer_state`` (a ``TrainerState``: ``global_step``, ``epoch``).

One idea per module:
  combine  ``RewardSpec`` (a function, its weight, name, time limit, whether it is
           required), ``combine_rewards`` (the weighted sum over the functions that
           scored), ``RewardResult`` and ``RewardStats`` (what a batch gave)
  runner   ``RewardRunner``: runs specs on a batch; errors, bad values and hangs abstain
  calls    one call: how a function is called and its return judged; ``RewardError``
  workers  the processes that run calls under a time limit, and never outlive the trainer
  loading  ``load_reward_function("module:function")``, ``load_reward_specs`` (a config's list)
  faults   functions that misbehave on purpose, for tests and soak runs
  verifiers ready reward functions: ``math_answer``, ``exact_match``, ``numeric_match``
           (gold column ``answer``), ``answer_format``, ``regex_reward(pattern)``
  judge    ``judge``: a model behind any OpenAI-compatible endpoint grades each completion
"""

from rlvr.rewards.calls import RewardError, RewardFn, TrainerState
from rlvr.rewards.combine import RewardResult, RewardSpec, RewardStats, combine_rewards
from rlvr.rewards.loading import load_reward_function, load_reward_specs
from rlvr.rewards.runner import RewardRunner
from rlvr.rewards.verifiers import answer_format, exact_match, math_answer, numeric_match, regex_reward

__all__ = [
    "RewardError",
    "RewardFn",
    "RewardResult",
    "RewardRunner",
    "RewardSpec",
    "RewardStats",
    "TrainerState",
    "answer_format",
    "combine_rewards",
    "exact_match",
    "load_reward_function",
    "load_reward_specs",
    "math_answer",
    "numeric_match",
    "regex_reward",
]
