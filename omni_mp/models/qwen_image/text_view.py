"""`model_part: qwen_image_text`: the text encoder of a diffusers-layout Qwen-Image checkpoint,
as a directory vLLM loads like any Qwen2.5-VL checkpoint.

A diffusers checkpoint keeps the encoder in `text_encoder/` and its tokenizer in `tokenizer/`;
the view is a small directory of symlinks to both (nothing copied). vLLM runs it as its own
`Qwen2_5_VLForConditionalGeneration` with `language_model_only` (no vision tower is built: the
encoder reads text only). Cached by omni_mp.models.checkpoint_view. No vLLM import here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_mp.models.checkpoint_view import cached_view, link_files
from omni_mp.models.family import EngineModel

VIEW_VERSION = 1


def _sources(checkpoint: Path) -> list[Path]:
    files = []
    for sub in ("text_encoder", "tokenizer"):
        d = checkpoint / sub
        if not d.is_dir():
            raise FileNotFoundError(f"{checkpoint}: no {sub}/ (a diffusers-layout Qwen-Image checkpoint has one)")
        files += sorted(p for p in d.iterdir() if p.is_file())
    return files


def text_view_dir(checkpoint: str) -> Path:
    root = Path(checkpoint).resolve()
    sources = _sources(root)  # text_encoder/ first: its config.json wins over any of tokenizer/
    return cached_view("qwen_image_text", root, sources, VIEW_VERSION, lambda out: link_files(sources, out))


def text_engine_model(model_dir: str, engine_args: dict[str, Any]) -> EngineModel:
    """The encoder's view and the engine args it needs: text only, no prefix caching (every
    prompt's hidden rows are needed, a cached prefix would skip them)."""
    args = {"language_model_only": True, "enable_prefix_caching": False, **engine_args}
    return EngineModel(str(text_view_dir(model_dir)), args)
