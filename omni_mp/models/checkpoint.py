"""Reading parts of a Hugging Face checkpoint dir without loading the whole model: the
tensors under a key prefix, or named ones (possibly sharded safetensors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def _files_for(model_dir: Path, wanted: Any) -> list[str]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return sorted({f for k, f in weight_map.items() if wanted(k)})
    return ["model.safetensors"] if (model_dir / "model.safetensors").exists() else []


def load_prefixed(model_dir: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor whose key starts with `prefix`, with the prefix removed."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    state: dict[str, torch.Tensor] = {}
    for name in _files_for(model_dir, lambda k: k.startswith(prefix)):
        with safe_open(str(model_dir / name), framework="pt") as fh:
            for key in fh.keys():
                if key.startswith(prefix):
                    state[key[len(prefix) :]] = fh.get_tensor(key)
    return state


def load_tensors(model_dir: str | Path, keys: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors; KeyError names the ones the checkpoint lacks."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    wanted = set(keys)
    out: dict[str, torch.Tensor] = {}
    for name in _files_for(model_dir, lambda k: k in wanted):
        with safe_open(str(model_dir / name), framework="pt") as fh:
            for key in wanted.intersection(fh.keys()):
                out[key] = fh.get_tensor(key)
    missing = sorted(wanted - out.keys())
    if missing:
        raise KeyError(f"{model_dir}: no tensors {missing} in its safetensors files")
    return out
