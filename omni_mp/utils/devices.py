"""What a stage's `devices` mean: indices into the GPUs the caller sees, as in vLLM, torch and
Ray. A coordinator started with `CUDA_VISIBLE_DEVICES=2,3` (a SLURM job, a user sharing a
host) gives a stage with `devices: [0]` the caller's entry 0, physical GPU 2; unset, an index
is the GPU of that index. The stage process gets the caller's entries themselves (numbers,
`GPU-<uuid>` or `MIG-<uuid>`), so it sees the same GPU whether or not it is an MPS client
(the MPS daemon runs with every GPU visible: omni_mp.control.mps_guard).

The memory check before start reads NVML, which numbers GPUs its own way (PCI order, as
`CUDA_DEVICE_ORDER=PCI_BUS_ID`); `nvml_index` maps a caller's entry to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


class DeviceError(ValueError):
    """A stage names a GPU the caller does not see; the message says which and what is visible."""


def caller_devices(env: Mapping[str, str]) -> list[str] | None:
    """The caller's visible GPUs as its CUDA_VISIBLE_DEVICES lists them; None: unset (all).
    CUDA stops at the first entry it cannot parse; entries are kept as written."""
    value = env.get(VISIBLE_ENV)
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def visible_entries(devices: list[int], env: Mapping[str, str], who: str = "stage") -> list[str]:
    """The caller's CUDA_VISIBLE_DEVICES entries for `devices` (indices into what it sees)."""
    seen = caller_devices(env)
    if seen is None:
        return [str(d) for d in devices]
    missing = [d for d in devices if d >= len(seen)]
    if missing:
        raise DeviceError(
            f"{who}: devices {missing} are not visible: the caller's {VISIBLE_ENV}={env.get(VISIBLE_ENV)!r} "
            f"shows {len(seen)} GPU(s), so `devices` may use 0..{len(seen) - 1}"
        )
    return [seen[d] for d in devices]


def nvml_index(entry: str, by_uuid: Callable[[str], int | None]) -> int | None:
    """NVML's index of a CUDA_VISIBLE_DEVICES entry: a number is taken as that index (the
    PCI order; see the module doc), a `GPU-`/`MIG-` uuid is looked up; None: not found."""
    if entry.isdigit():
        return int(entry)
    return by_uuid(entry)
