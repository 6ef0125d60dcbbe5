"""The on-disk cache of checkpoint dirs that omni_mp writes itself (tiny test checkpoints,
7B-shape config dirs, talker views): a dir per spec, keyed by a hash of the spec (and of the
transformers version and the builder version), built once under a file lock and published by
an atomic rename, so every later caller (test process or stage process) reuses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

# Bump when the build procedure changes, so stale cache entries are not reused.
BUILDER_VERSION = 1


def cache_root() -> Path:
    return Path(os.environ.get("OMNI_MP_CACHE", Path.home() / ".cache" / "omni_mp")) / "models"


def spec_key(spec: msgspec.Struct) -> str:
    import transformers

    blob = json.dumps(
        {
            "spec": msgspec.to_builtins(spec),
            "kind": type(spec).__name__,
            "builder": BUILDER_VERSION,
            "transformers": transformers.__version__,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_cached(
    prefix: str,
    spec: msgspec.Struct,
    build: Callable[[Path], None],
    *,
    cache_dir: Path | None = None,
    verbose: bool = True,
) -> Path:
    """Return `<cache>/<prefix>-<hash of spec>`, running `build(tmp_dir)` once to create it
    (process- and thread-safe: a file lock, then an atomic rename)."""
    root = cache_dir or cache_root()
    target = root / f"{prefix}-{spec_key(spec)}"
    if (target / "config.json").exists():
        return target
    with file_lock(root / f".{target.name}.lock"):
        if (target / "config.json").exists():
            return target
        t0 = time.monotonic()
        if verbose:
            print(f"[omni_mp] building tiny model {target.name} ...", flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            build(tmp)
            os.replace(tmp, target)  # atomic: readers never see a half-written checkpoint
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if verbose:
            print(f"[omni_mp] built {target} in {time.monotonic() - t0:.1f}s", flush=True)
    return target
