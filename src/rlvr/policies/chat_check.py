"""Chat templates rendered turn by turn, and the check that this equals rendering whole.

An episode is built token in, token out: each observation's messages added as the text the template adds for them
(the *delta*, ``render_delta``). Trained on, this must be what the template gives for the whole conversation; not
every template is consistent (Qwen3's drops earlier ``<think>`` parts). The delta: docs/explanation/policies.md."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]  # {"role": "user" | "assistant" | "tool" | "system", "content": str, ...}

EXCERPT_WIDTH = 40  # characters of each side shown around a first difference


class ChatTemplateMismatch(ValueError):
    """The whole rendering of a conversation does not start with its turn-by-turn text (``position``: the first
    difference's character offset; ``turn_by_turn``, ``whole``: excerpts around it)."""

    def __init__(self, message: str, position: int, turn_by_turn: str, whole: str) -> None:
        super().__init__(message)
        self.position = position
        self.turn_by_turn = turn_by_turn
        self.whole = whole


def render_delta(tokenizer: Any, messages: list[Message], new: list[Message], end_of_turn: str | None = None,
                 **template_kwargs: Any) -> str:
    """The text the chat template adds when the observations ``new`` follow ``messages`` (ending with an assistant
    turn), up to the next generation prompt. ``end_of_turn``: where the policy's turn ends (default: EOS).

    Raises ChatTemplateMismatch when the whole rendering does not start with the prefix, ValueError when
    ``messages`` does not end with an assistant turn, there is no chat template, or it writes no end-of-turn text.
    """
    prefix = _rendered_through_turn(tokenizer, messages, end_of_turn, template_kwargs)
    whole = _render(tokenizer, [*messages, *new], True, template_kwargs)
    if not whole.startswith(prefix):
        at = _first_difference(prefix, whole)
        raise ChatTemplateMismatch(
            f"the chat template renders the conversation whole differently from turn by turn, at character {at}: "
            f"turn by turn {_excerpt(prefix, at)}, whole {_excerpt(whole, at)}",
            at, _excerpt(prefix, at), _excerpt(whole, at),
        )
    return whole[len(prefix):]


def check_chat_template(tokenizer: Any, conversations: list[list[Message]], limit: int = 5,
                        end_of_turn: str | None = None, **template_kwargs: Any) -> list[str]:
    """A description of each conversation (at most ``limit``) whose turn-by-turn text differs from its whole
    rendering; [] when all agree or there is no chat template.

    Each conversation is rebuilt as an episode builds it (generation prompt, each assistant turn's content and
    end-of-turn text, the delta after it); after each assistant turn the text so far must equal the rendered
    prefix. ValueError (as ``render_delta``) when the template writes no ``end_of_turn`` after an assistant turn.
    """
    if not getattr(tokenizer, "chat_template", None):
        return []
    end_of_turn = end_of_turn if end_of_turn is not None else tokenizer.eos_token
    differences: list[str] = []
    for index, conversation in enumerate(conversations):
        if len(differences) >= limit:
            break
        difference = _first_conversation_difference(tokenizer, conversation, end_of_turn, template_kwargs)
        if difference is not None:
            differences.append(f"conversation {index}, {difference}")
    return differences


def check_turn_end(tokenizer: Any, end_of_turn: str | None = None) -> None:
    """ValueError (as ``render_delta``'s) when the chat template writes no ``end_of_turn`` after an assistant turn:
    a conversation could not go on after the policy's turn. Checked on a short conversation before any work."""
    if getattr(tokenizer, "chat_template", None):
        _rendered_through_turn(tokenizer, list(_TURN_CHECK), end_of_turn, {})


# user and assistant contents no template's own text holds, so the assistant's is found where it is rendered
_TURN_CHECK = ({"role": "user", "content": "Which turn is this?"}, {"role": "assistant", "content": "The first."})


def _first_conversation_difference(tokenizer: Any, conversation: list[Message], end_of_turn: str,
                                   template_kwargs: dict[str, Any]) -> str | None:
    """Where one conversation's turn-by-turn text first leaves its whole rendering, or None."""
    turns = [i for i, message in enumerate(conversation) if message.get("role") == "assistant"]
    if not turns:
        return None
    text = _render(tokenizer, conversation[:turns[0]], True, template_kwargs)
    for k, i in enumerate(turns):
        text += str(conversation[i].get("content") or "") + end_of_turn
        prefix = _rendered_through_turn(tokenizer, conversation[:i + 1], end_of_turn, template_kwargs)
        if text != prefix:
            at = _first_difference(text, prefix)
            return (f"message {i} (assistant): at character {at}: turn by turn {_excerpt(text, at)}, "
                    f"whole {_excerpt(prefix, at)}")
        after = turns[k + 1] if k + 1 < len(turns) else len(conversation)
        if after > i + 1:
            try:
                text += render_delta(tokenizer, conversation[:i + 1], conversation[i + 1:after], end_of_turn,
                                     **template_kwargs)
            except ChatTemplateMismatch as err:
                return (f"message {i + 1} ({conversation[i + 1].get('role')}): at character {err.position}: "
                        f"turn by turn {err.turn_by_turn}, whole {err.whole}")
    return None


def _rendered_through_turn(tokenizer: Any, messages: list[Message], end_of_turn: str | None,
                           template_kwargs: dict[str, Any]) -> str:
    """``messages`` rendered, cut after the last end-of-turn text: the token stream once the policy sampled it."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("render_delta: the messages before an observation must end with an assistant turn, "
                         f"not {messages[-1].get('role') if messages else 'nothing'!r}")
    end_of_turn = end_of_turn if end_of_turn is not None else tokenizer.eos_token
    rendered = _render(tokenizer, messages, False, template_kwargs)
    end = rendered.rfind(end_of_turn) if end_of_turn else -1
    content = str(messages[-1].get("content") or "")
    start = rendered.rfind(content) if content else -1
    if end < 0 or (start >= 0 and end < start + len(content)):
        raise ValueError(
            f"the chat template writes no end-of-turn text {end_of_turn!r} (where the policy's turns end: the "
            f"tokenizer's EOS) after an assistant turn (it renders {_excerpt(rendered, len(rendered))}); set "
            "policy.options.chat_template to a template that ends each assistant turn with it"
        )
    return rendered[:end + len(end_of_turn)]


def _render(tokenizer: Any, messages: list[Message], add_generation_prompt: bool,
            template_kwargs: dict[str, Any]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template: observations are appended as plain text, "
                         "there is no delta to render")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **template_kwargs)


def _first_difference(a: str, b: str) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter's length when one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _excerpt(text: str, at: int, width: int = EXCERPT_WIDTH) -> str:
    """``text`` around index ``at`` as a repr of at most ``width`` characters, "..." where cut."""
    start = max(0, min(at - width // 2, len(text) - width))
    return ("..." if start else "") + repr(text[start:start + width]) + ("..." if start + width < len(text) else "")
