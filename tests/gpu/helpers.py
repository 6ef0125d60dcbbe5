"""What the GPU tests share: whether there is CUDA, GPU counts, the device's name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CUDA = torch.cuda.is_available()


def gpus(n: int) -> pytest.MarkDecorator:
    """Skip unless this host has at least `n` CUDA devices."""
    have = torch.cuda.device_count() if CUDA else 0
    return pytest.mark.skipif(have < n, reason=f"needs {n} GPU{'s' if n > 1 else ''}, this host has {have}")


def device() -> str:
    """GPU 0's name (or "CPU")."""
    return torch.cuda.get_device_name(0) if CUDA else "CPU"
