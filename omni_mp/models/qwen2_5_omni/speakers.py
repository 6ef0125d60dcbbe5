"""Qwen2.5-Omni's speakers: `spk_dict.pt` of a checkpoint dir (read by the talker's processor
and by token2wav)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def load_speakers(model_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Qwen2.5-Omni's `spk_dict.pt`: {name: {"bos_token", "cond", "ref_mel"}}."""
    path = Path(model_dir) / "spk_dict.pt"
    if not path.exists():
        raise FileNotFoundError(f"{model_dir}: no spk_dict.pt (the speakers' conditioning)")
    # Tensors and plain values only (weights_only): no pickled code runs from a checkpoint file.
    speakers = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(speakers, dict) or not speakers:
        raise ValueError(f"{path}: expected a non-empty {{name: entry}} dict")
    return speakers
