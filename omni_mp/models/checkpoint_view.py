"""A view of a checkpoint: a small directory, cached under `cache_root()/views`
(omni_mp.models.cache), of symlinks to some of the checkpoint's files and, where a family needs
one, a config of its own, so that vLLM loads one part of the checkpoint as a model. Keyed by
the checkpoint's path, the names, sizes and mtimes of the files the view is made from, and the
family's view version. No vLLM import here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from omni_mp.models.cache import build_cached, cache_root


class ViewSpec(msgspec.Struct, frozen=True):
    path: str
    files: tuple[tuple[str, int, int], ...]  # name relative to the checkpoint, size, mtime (ns)
    view: int  # the family's view version: bump it when what a view holds changes


def weight_files(checkpoint: Path, *, require: bool) -> list[Path]:
    """The checkpoint's safetensors files (and their index); `require`: at least one."""
    files = sorted(checkpoint.glob("*.safetensors"))
    index = checkpoint / "model.safetensors.index.json"
    if index.exists():
        files.append(index)
    if require and not any(f.suffix == ".safetensors" for f in files):
        raise FileNotFoundError(f"{checkpoint}: no *.safetensors weight files")
    return files


def link_files(files: Sequence[Path], out: Path) -> None:
    """Symlink each file into `out` by its name; the first of a name wins."""
    for f in files:
        target = out / f.name
        if not target.exists():
            target.symlink_to(f)


def cached_view(
    prefix: str, checkpoint: Path, sources: Sequence[Path], version: int, build: Callable[[Path], None]
) -> Path:
    """The view `build(dir)` writes, made from `sources` (files under `checkpoint`), built once
    (file lock, atomic rename) and reused while those files are unchanged."""
    stats = tuple((str(p.relative_to(checkpoint)), p.stat().st_size, p.stat().st_mtime_ns) for p in sources)
    spec = ViewSpec(path=str(checkpoint), files=stats, view=version)
    return build_cached(prefix, spec, build, cache_dir=cache_root() / "views", verbose=False)
