"""A "talker view" of a full Qwen2.5-Omni checkpoint: a directory that vLLM loads as the talker alone.

vLLM 0.25.0 has no talker model, and a full omni directory resolves to its thinker. The view is a
small directory of our own: `config.json` is the checkpoint's `talker_config` as a standalone
config (model_type `qwen2_5_omni_talker`, which transformers' AutoConfig knows) naming our vLLM
model class (`omni_mp.models.qwen2_5_omni.vllm_hooks_talker`, registered by `register_talker()`), and the
weight files are symlinks to the checkpoint's own (the model loads only `talker.*` keys).

`projection_size` = `embedding_size`: vLLM sizes its persistent `inputs_embeds` buffer by
`ModelConfig.get_inputs_embeds_size()`, which returns a text config's `projection_size` when it has
one. The talker's input embeddings then live in the thinker's space (width E, before
`thinker_to_talker_proj`), exactly where transformers adds the codec embedding and the thinker
rows; the model projects to its hidden size itself.

Views are cached by omni_mp.models.checkpoint_view (whose cache key includes the transformers
version: the config is rewritten by transformers' `to_dict`).
No vLLM import here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from omni_mp.models.checkpoint_view import cached_view, link_files, weight_files

TALKER_ARCH = "OmniMpQwen2_5OmniTalker"  # the name register_talker() gives our vLLM model class
VIEW_VERSION = 1  # bump when the view's contents change


def talker_config_dict(checkpoint: Path) -> dict:
    """The checkpoint's talker config as a standalone config naming our vLLM model class."""
    from transformers import AutoConfig

    full = AutoConfig.from_pretrained(checkpoint)
    talker = getattr(full, "talker_config", None)
    if talker is None:
        raise ValueError(f"{checkpoint}: config has no talker_config (not a Qwen2.5-Omni checkpoint)")
    cfg = talker.to_dict()
    cfg["architectures"] = [TALKER_ARCH]
    cfg["projection_size"] = int(talker.embedding_size)  # the width of vLLM's inputs_embeds (see above)
    dtype = getattr(full, "dtype", None) or getattr(full, "torch_dtype", None)
    if cfg.get("dtype") is None and dtype is not None:
        cfg["dtype"] = str(dtype).removeprefix("torch.")  # vLLM's dtype "auto" reads it
    return cfg


def _write_view(checkpoint: Path, files: list[Path], out: Path) -> None:
    link_files(files, out)
    (out / "config.json").write_text(json.dumps(talker_config_dict(checkpoint), indent=2, sort_keys=True))


def talker_view_dir(checkpoint_dir: str | Path, *, require_weights: bool = True) -> Path:
    """The view directory for `checkpoint_dir`, written once (file lock, atomic rename) and reused.
    `require_weights=False` (vLLM's `load_format: dummy` reads no weights): a checkpoint dir
    with only config files still gets a view, with no weight links."""
    checkpoint = Path(checkpoint_dir).resolve()
    files = weight_files(checkpoint, require=require_weights)
    write = functools.partial(_write_view, checkpoint, files)
    return cached_view("talker", checkpoint, [checkpoint / "config.json", *files], VIEW_VERSION, write)
