"""Multi-turn episodes: environments, their tools, and running episodes token in, token out.

``base``: the interface (``Environment``, ``Step``, ``Episode``). ``episodes``: running a batch of episodes with a
causal LM. ``policy``: the LM acting in an environment, as a ``Policy``. ``hosts``: where environment code runs
(``operations``: what it does there). ``tools``: tool calls run in sandboxed workers (``sandbox``: bubblewrap's
jail for the programs a policy writes). ``games``: ready environments. ``adapters``: TRL-style environments.
"""

from rlvr.environments.base import Environment, Episode, Observation, Step, ToolCall, ToolError, ToolResult, Turn

__all__ = ["Environment", "Episode", "Observation", "Step", "ToolCall", "ToolError", "ToolResult", "Turn"]
