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

Views are cached under `cache_root()/views` (omni_mp.models.cache), keyed by the checkpoint
path, its files' sizes and mtimes, and the transformers version (the config is rewritten by
transformers' `to_dict`).
No vLLM import here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import msgspec

from omni_mp.models.cache import build_cached, cache_root

TALKER_ARCH = "OmniMpQwen2_5OmniTalker"  # the name register_talker() gives our vLLM model class
VIEW_VERSION = 1  # bump when the view's contents change


def _weight_files(checkpoint: Path, *, require: bool = True) -> list[Path]:
    files = sorted(checkpoint.glob("*.safetensors"))
    index = checkpoint / "model.safetensors.index.json"
    if index.exists():
        files.append(index)
    if require and not any(f.suffix == ".safetensors" for f in files):
        raise FileNotFoundError(f"{checkpoint}: no *.safetensors weight files")
    return files


class _ViewSpec(msgspec.Struct, frozen=True):
    """What a view holds depends on: its cache key (with the transformers version, which
    rewrites the config through `to_dict`)."""

    path: str
    files: tuple[tuple[str, int, int], ...]  # name, size, mtime (ns) of config.json and the weights
    view: int = VIEW_VERSION


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
    for f in files:
        (out / f.name).symlink_to(f)
    (out / "config.json").write_text(json.dumps(talker_config_dict(checkpoint), indent=2, sort_keys=True))


def talker_view_dir(checkpoint_dir: str | Path, *, require_weights: bool = True) -> Path:
    """The view directory for `checkpoint_dir`, written once (file lock, atomic rename) and reused.
    `require_weights=False` (vLLM's `load_format: dummy` reads no weights): a checkpoint dir
    with only config files still gets a view, with no weight links."""
    checkpoint = Path(checkpoint_dir).resolve()
    files = _weight_files(checkpoint, require=require_weights)
    stats = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in [checkpoint / "config.json", *files])
    spec = _ViewSpec(path=str(checkpoint), files=stats)
    write = functools.partial(_write_view, checkpoint, files)
    return build_cached("talker", spec, write, cache_dir=cache_root() / "views", verbose=False)
