"""torch tensors on the wire: the ArrayCodec of the processes that compute with torch (stages,
the coordinator). Kept apart from tensor_codec so that a client never imports torch."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from omni_mp.wire.basics import WIRE_DTYPES, Header, PayloadError

# Name on the wire -> torch dtype (the names are torch's own).
TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in WIRE_DTYPES}
_TORCH_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}


class TorchTensors:
    """CPU, dense torch tensors of the wire dtypes (bfloat16 included)."""

    def header(self, value: torch.Tensor, path: str) -> Header:
        if value.device.type != "cpu":
            # Moving to CPU is a device copy the caller should schedule (and overlap) itself.
            raise PayloadError(f"{path}: tensor is on {value.device}; only CPU tensors are sent, call .cpu() first")
        if value.layout != torch.strided:
            raise PayloadError(f"{path}: layout {value.layout} is not sent; only dense (strided) tensors")
        name = _TORCH_NAMES.get(value.dtype)
        if name is None:
            raise PayloadError(f"{path}: dtype {value.dtype} is not supported; supported: {list(TORCH_DTYPES)}")
        return name, list(value.shape), value.numel() * value.element_size()

    def to_bytes(self, value: torch.Tensor) -> np.ndarray:
        # Supported dtypes are real, so no lazy conj/neg bit exists; the uint8 view makes
        # bfloat16 expressible in numpy, and the array keeps the tensor's memory alive.
        return value.detach().contiguous().reshape(-1).view(torch.uint8).numpy()

    def from_buffer(self, dtype: str, shape: list[int], buffer: memoryview, path: str) -> torch.Tensor:
        torch_dtype = TORCH_DTYPES[dtype]
        if buffer.nbytes == 0:
            return torch.empty(shape, dtype=torch_dtype)  # frombuffer rejects empty buffers
        if buffer.readonly:
            # Only callers passing bytes get here (ZMQ frames and shared memory are writable).
            # torch warns that it cannot mark tensors read-only; the documented contract is
            # that decoded tensors are views to be treated as read-only, so it adds nothing.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                flat = torch.frombuffer(buffer, dtype=torch_dtype)
        else:
            flat = torch.frombuffer(buffer, dtype=torch_dtype)
        if torch_dtype is torch.bool and bool((flat.view(torch.uint8) > 1).any()):
            # torch assumes bool bytes are 0 or 1; anything else breaks kernels in odd ways.
            raise PayloadError(f"{path}: bool tensor holds bytes other than 0 and 1")
        return flat.view(shape)

    def concat(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat(list(parts))


TORCH_TENSORS = TorchTensors()
