"""Tensor <-> wire primitives, free of torch: the dtype table, header checks, limits, the one
error type, and numpy arrays as the codec's core array type.

A tensor on the wire is (dtype name, shape, nbytes) plus its raw bytes. The codec (codec.py)
sends numpy arrays and torch tensors alike and builds received tensors through an
`ArrayCodec`: `NUMPY_ARRAYS` here, or `torch_tensors.TORCH_TENSORS` (imported only by
processes that use torch, so `omni_mp.client.omni_client` never imports torch). numpy has no bfloat16:
a bfloat16 tensor is sent from torch and decoded into torch, whichever codec is asked.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
import numpy as np

from omni_mp.wire.basics import WIRE_DTYPES, Header, PayloadError

# The wire dtypes numpy has (all but bfloat16).
NUMPY_DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in WIRE_DTYPES if name != "bfloat16"}
_NUMPY_NAMES: dict[np.dtype, str] = {v: k for k, v in NUMPY_DTYPES.items()}

# Upper bounds of the configurable limits below: the message types carry them as
# Meta(max_length=...) so msgspec refuses a longer list while decoding (messages.py).
MAX_NDIM = 32
MAX_LIST_LENGTH = 2**20
MAX_INFO_ENTRIES = 1024

# A peer can send any msgpack it likes, so messages show at most this much of a bad value.
_MAX_SHOWN = 80


class Limits(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Bounds every received message is checked against before any tensor is built.

    Loaded from the pipeline YAML (unknown keys rejected). Defaults:
      allowed_dtypes         all of WIRE_DTYPES
      max_ndim               8
      max_tensor_elements    2**30        (a [32k, 32k] tensor)
      max_tensor_bytes       1 GiB        (also the ZMQ MAXMSGSIZE: ZMQ checks frame by frame)
      max_message_bytes      2 GiB        body + every tensor, shared-memory ones included
      max_body_bytes         16 MiB       the msgpack body frame; bounded on its own because
                                          decoding inflates it (~40 B of Python per list item)
      max_info_entries       64           entries of one dict (additional_information, info)
      max_name_length        128          a dict key
      max_string_length      65536        any string (error messages may carry tracebacks)
      max_list_length        2**20        any list (token ids)
      max_request_id_length  128
    """

    allowed_dtypes: tuple[str, ...] = tuple(WIRE_DTYPES)
    max_ndim: int = 8
    max_tensor_elements: int = 2**30
    max_tensor_bytes: int = 2**30
    max_message_bytes: int = 2**31
    max_body_bytes: int = 16 * 2**20
    max_info_entries: int = 64
    max_name_length: int = 128
    max_string_length: int = 65536
    max_list_length: int = 2**20
    max_request_id_length: int = 128

    def __post_init__(self) -> None:
        # Raised as ValueError so msgspec.convert (the YAML loader) reports the key path.
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, int) and value <= 0:
                raise ValueError(f"Limits.{name} must be > 0, got {value}")
        for name, bound in (
            ("max_ndim", MAX_NDIM),
            ("max_list_length", MAX_LIST_LENGTH),
            ("max_info_entries", MAX_INFO_ENTRIES),
        ):
            if getattr(self, name) > bound:
                raise ValueError(f"Limits.{name} must be <= {bound} (the bound the message types carry)")
        unknown = [d for d in self.allowed_dtypes if d not in WIRE_DTYPES]
        if unknown:
            raise ValueError(f"Limits.allowed_dtypes: unsupported {unknown}; choose from {list(WIRE_DTYPES)}")

    @property
    def max_frame_bytes(self) -> int:
        """The largest single frame a valid message can contain (for ZMQ MAXMSGSIZE)."""
        return max(self.max_tensor_bytes, self.max_body_bytes)


DEFAULT_LIMITS = Limits()


def shown(value: Any) -> str:
    """repr() of a value from the wire, cut short so an error message stays small."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def check_header(dtype: str, shape: list[int], nbytes: int, limits: Limits, path: str) -> None:
    """Validate a tensor header against `limits`. Pure arithmetic: nothing is allocated, so a
    header claiming 10**12 elements costs no more than a valid one."""
    if dtype not in limits.allowed_dtypes:
        raise PayloadError(f"{path}: dtype {shown(dtype)} not in allowed_dtypes {list(limits.allowed_dtypes)}")
    if len(shape) > limits.max_ndim:
        raise PayloadError(f"{path}: ndim {len(shape)} > max_ndim={limits.max_ndim}")
    for dim in shape:
        if dim < 0:
            raise PayloadError(f"{path}: negative dimension {dim} in shape {shown(shape)}")
    numel = math.prod(shape)
    if numel > limits.max_tensor_elements:
        raise PayloadError(
            f"{path}: {numel} elements (shape {shown(shape)}) > max_tensor_elements={limits.max_tensor_elements}"
        )
    expected = numel * WIRE_DTYPES[dtype]
    if nbytes != expected:
        raise PayloadError(f"{path}: nbytes {nbytes} != {expected} for shape {shown(shape)} of {dtype}")
    if nbytes > limits.max_tensor_bytes:
        raise PayloadError(f"{path}: {nbytes} bytes > max_tensor_bytes={limits.max_tensor_bytes}")


class ArrayCodec(Protocol):
    """How one array library's tensors are read for sending and built from received bytes."""

    def header(self, value: Any, path: str) -> Header:
        """(dtype name, shape, nbytes) of an array about to be sent; PayloadError if it cannot travel."""
        ...

    def to_bytes(self, value: Any) -> np.ndarray:
        """The array's bytes as a flat uint8 numpy array sharing its memory (copied only if
        the array is not contiguous)."""
        ...

    def from_buffer(self, dtype: str, shape: list[int], buffer: memoryview, path: str) -> Any:
        """An array viewing `buffer` (no copy); the header passed check_header and `buffer`
        holds exactly its nbytes."""
        ...

    def concat(self, parts: Sequence[Any]) -> Any:
        """The arrays joined along their first dimension."""
        ...


class NumpyArrays:
    """numpy arrays (a bfloat16 tensor, which numpy lacks, is decoded into torch)."""

    def header(self, value: np.ndarray, path: str) -> Header:
        name = _NUMPY_NAMES.get(value.dtype)
        if name is None:
            raise PayloadError(f"{path}: dtype {value.dtype} is not supported; supported: {list(NUMPY_DTYPES)}")
        return name, list(value.shape), value.nbytes

    def to_bytes(self, value: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(value).reshape(-1).view(np.uint8)

    def from_buffer(self, dtype: str, shape: list[int], buffer: memoryview, path: str) -> Any:
        if dtype == "bfloat16":
            return torch_arrays().from_buffer(dtype, shape, buffer, path)
        flat = np.frombuffer(buffer, dtype=NUMPY_DTYPES[dtype])
        if dtype == "bool" and bool((flat.view(np.uint8) > 1).any()):
            raise PayloadError(f"{path}: bool tensor holds bytes other than 0 and 1")
        return flat.reshape(shape)

    def concat(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts)


NUMPY_ARRAYS = NumpyArrays()


def array_codec(value: Any) -> ArrayCodec | None:
    """The codec of a value that is an array (numpy, or torch when torch is loaded), else None.
    A torch tensor can only exist once torch is imported, so this never imports torch itself."""
    if isinstance(value, np.ndarray):
        return NUMPY_ARRAYS
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return torch_arrays()
    return None


def torch_arrays() -> ArrayCodec:
    """The torch ArrayCodec; imports torch (for processes that compute with it, and for
    bfloat16, which numpy lacks)."""
    from omni_mp.wire.torch_tensors import TORCH_TENSORS

    return TORCH_TENSORS
