"""Where a tool call starts in the thinker's answer, so that the talker never speaks one.

Qwen's chat format writes a call as `<tool_call>...</tool_call>` (one added token in the released
tokenizer, but a constrained or unusual answer may spell it in pieces), so the answer is read
as text: each token's text (cached per id), the marker searched in the text of the tokens not
yet spoken. Tokens whose text may still become the start of the marker are held back until the
next token settles it (a short wait only after a `<`). Transformers' generate() has no such
cut (it would voice the call's JSON); this is omni_mp's, documented in docs/http.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

MARKER = "<tool_call>"
MAX_CACHED = 1 << 18  # token texts kept (a vocabulary's worth)


class ToolCallCut:
    def __init__(self, tokenizer: Any, marker: str = MARKER) -> None:
        self._tok = tokenizer
        self.marker = marker
        self._texts: dict[int, str] = {}

    @classmethod
    def load(cls, model_dir: Path) -> ToolCallCut | None:
        """From the checkpoint's tokenizer.json; None when it has none or no `<tool_call>` token
        (its chat format then has no tool calls)."""
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            return None
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return cls(tok) if tok.token_to_id(MARKER) is not None else None

    def text(self, token: int) -> str:
        got = self._texts.get(token)
        if got is None:
            got = self._tok.decode([token], skip_special_tokens=False)
            if len(self._texts) < MAX_CACHED:
                self._texts[token] = got
        return got

    def scan(self, ids: Sequence[int], start: int, final: bool = False) -> tuple[int | None, int]:
        """Over ids[start:] (no marker starts before `start`): (the index of the token where the
        marker starts, or None; the end index of the tokens that are safe to speak). `final`:
        no token follows, nothing is held back."""
        ends, text = [], ""
        for t in ids[start:]:
            text += self.text(t)
            ends.append(len(text))
        at = text.find(self.marker)
        if at >= 0:
            k = next(i for i, e in enumerate(ends) if e > at)
            return start + k, start + k
        held = 0
        if not final:
            for n in range(min(len(self.marker) - 1, len(text)), 0, -1):
                if text.endswith(self.marker[:n]):
                    held = n
                    break
        safe = sum(1 for e in ends if e <= len(text) - held)
        return None, start + safe
