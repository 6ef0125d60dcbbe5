"""Incremental text of a streamed stage: the new text of each chunk's token ids, and where
a stop string cuts the answer."""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"  # a multi-byte character cut between tokens: wait for its next token


class Detokenizer:
    """Decodes the growing id list and hands out only the text not handed out before; text
    that could still become a stop string is held back until it cannot.

    Each step decodes only the ids since the previous step's and those before them (their
    text is then cut off the front: the tokens' own context, so spaces and multi-byte
    characters come out as in a decode of the whole list), not the whole list again."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] were decoded last step: the context of the next decode
        self.read = 0  # ids[:read] are in `text`
        self.text = ""  # decoded so far (up to a stop string, once one is found)
        self.sent = 0  # characters handed out
        self.stopped = False

    def _held(self) -> int:
        """How many trailing characters might start a stop string."""
        held = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    held = max(held, k)
                    break
        return held

    def _cut(self) -> None:
        start = max(0, self.sent - max((len(s) for s in self.stop), default=0))
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def _decode_new(self) -> bool:
        """Append the text of the new ids; False while they end inside a character."""
        context = self.tokenizer.decode(self.ids[self.prefix : self.read])
        window = self.tokenizer.decode(self.ids[self.prefix :])
        if window.endswith(_REPLACEMENT) or not window.startswith(context):
            return False
        self.text += window[len(context) :]
        self.prefix, self.read = self.read, len(self.ids)
        return True

    def add(self, ids: list[int], final_text: str | None = None) -> str:
        """The new text after `ids`; `final_text` (the stage's own decode, on its last chunk)
        replaces the incremental decode."""
        if self.stopped:
            return ""
        self.ids.extend(ids)
        if final_text is not None:
            self.text = final_text
        elif not self._decode_new():
            return ""
        self._cut()
        end = len(self.text) if (self.stopped or final_text is not None) else len(self.text) - self._held()
        if end <= self.sent:
            return ""
        new, self.sent = self.text[self.sent : end], end
        return new


def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    from omni_mp.models.registry import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model))
