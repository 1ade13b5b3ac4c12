"""A record: one line of a run's metrics (a dict with its ``kind``, ``epoch`` and ``step``),
written as JSON, and how the prompts and responses in it read as text."""

from __future__ import annotations

import math
from typing import Any

Record = dict[str, Any]


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in lists and dicts too) replaced by None: a bare ``NaN`` makes a
    file other JSON readers refuse. Readers take a null as "no value"."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def prompt_text(prompt: Any) -> str:
    """A prompt as a person reads it: a chat one ``role: content`` line per message, any other as its ``str``."""
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        return "\n".join(f"{m.get('role', '?')}: {m['content']}" for m in prompt)
    return str(prompt)


def response_text(response: Any) -> str:
    """A response as a person reads it: an episode (``EpisodeText.as_record``'s turns) one turn per line, with
    tool calls and results, step rewards and the environment's error; any other as its ``str``."""
    if not (isinstance(response, list) and response and all(isinstance(t, dict) and "role" in t for t in response)):
        return str(response)
    lines = []
    for turn in response:
        if turn.get("error"):  # the error that ended the episode
            lines.append(f"{turn['role']} error: {turn['error']}")
            continue
        line = f"{turn['role']}{' (trained)' if turn.get('trained') else ''}: {turn.get('text', '')!r}"
        for call in turn.get("tool_calls") or []:
            line += f" [calls {call.get('name')}({call.get('arguments')})]"
        for result in turn.get("tool_results") or []:
            line += f" [{result.get('name')} {'error' if result.get('error') else 'gave'}: {result.get('content')!r}]"
        if turn.get("reward"):
            line += f" [reward {turn['reward']:g}]" if isinstance(turn["reward"], (int, float)) else ""
        if turn.get("note"):
            line += f" [{turn['note']}]"
        lines.append(line)
    return "\n".join(lines)


def plain_text(text: str) -> str:
    """``text`` as matplotlib draws it literally: a ``$`` would start mathtext, and invalid TeX fails the figure."""
    return str(text).replace("$", r"\$")
