"""A realtime response's prompt kept within a token budget by dropping the oldest whole turns.

The rule: the budget is `http.realtime.max_history_tokens`, and at most the thinker's
`max_model_len` less the answer's room (its `max_tokens`: the response's or session's
`max_output_tokens`, else the thinker stage's sampling `max_tokens`, else a quarter of the
context). While the prompt (instructions, tools and history, rendered by the chat template) is
over it, the oldest turn goes: a turn starts at a user message and runs to the next one; the
latest user turn is never dropped (a prompt still over the budget with it alone fails the
response: `context_length_exceeded`). The dropped items leave the conversation
(`conversation.item.deleted` for each, as the item bound does).

Counted as the thinker counts: the prompt's text by the tokenizer, each audio placeholder as
the tokens the family's processor expands it to (its prompt format's `audio_tokens`: a formula,
since running the Hugging Face processor takes 0.1 to 0.4 s of CPU per audio, measured here,
on the way to the answer's first audio)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni_mp.config.schema import RealtimeConfig
from omni_mp.http.realtime.history import HistoryItem
from omni_mp.models.family import CountsAudio


def token_budget(cfg: RealtimeConfig, max_model_len: int | None, answer_tokens: int | None) -> int | None:
    """The prompt's budget by the module's rule (None: no bound known)."""
    limits = [] if cfg.max_history_tokens is None else [cfg.max_history_tokens]
    if max_model_len is not None:
        room = answer_tokens if answer_tokens is not None else max_model_len // 4
        limits.append(max_model_len - room)
    return min(limits) if limits else None


def prompt_tokens(tokenizer: Any, fmt: CountsAudio, text: str, items: list[HistoryItem]) -> int:
    """The thinker's prompt length for `text`, rendered from `items`."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    placeholder = tokenizer.convert_tokens_to_ids(fmt.audio_placeholder)
    audio = sum(fmt.audio_tokens(len(it.audio)) for it in items if it.audio is not None)
    return len(ids) - sum(1 for t in ids if t == placeholder) + audio


def turn_starts(items: list[HistoryItem]) -> list[int]:
    """Where each turn starts: the first item, then every user message."""
    return [0] + [i for i, it in enumerate(items) if i > 0 and it.type == "message" and it.role == "user"]


def fit(items: list[HistoryItem], budget: int, count: Callable[[int], int]) -> tuple[int, int]:
    """(the first item kept, the prompt's tokens): the oldest turns dropped until `count(start)`,
    the prompt from `start` on, is within `budget`; the latest turn is always kept (its count
    may be over)."""
    starts = turn_starts(items) if items else [0]
    for start in starts[:-1]:
        n = count(start)
        if n <= budget:
            return start, n
    return starts[-1], count(starts[-1])
