"""Qwen-Image's time grid: flow matching from sigma 1 to 0 with a resolution-dependent
("dynamic") shift, written from the scheduler settings of the checkpoint
(`scheduler/scheduler_config.json`, diffusers' FlowMatchEulerDiscreteScheduler fields).

For N steps: sigmas linear from 1 to 1/N; mu grows linearly with the image's token count from
`base_shift` (at `base_image_seq_len` tokens) to `max_shift` (at `max_image_seq_len`); the
exponential shift maps s -> e^mu / (e^mu + (1/s - 1)); with `shift_terminal`, the grid is
stretched so that its last sigma is that value; then 0 is appended. An Euler step from
sigma_k to sigma_k+1 is x + (sigma_k+1 - sigma_k) v. Computed in float32 in the order the
reference does, so the grids agree bit for bit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import numpy as np
import torch


class FlowSchedule(msgspec.Struct, frozen=True):
    """The scheduler settings the grid uses (others must be at their neutral values)."""

    num_train_timesteps: int = 1000
    use_dynamic_shifting: bool = True
    time_shift_type: str = "exponential"
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    base_shift: float = 0.5
    max_shift: float = 1.15
    shift_terminal: float | None = None

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path) -> FlowSchedule:
        raw = json.loads((Path(model_dir) / "scheduler" / "scheduler_config.json").read_text())
        for name in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas"):
            if raw.get(name):
                raise ValueError(f"scheduler_config.json: {name} is not supported")
        if not raw.get("use_dynamic_shifting", False):
            raise ValueError("scheduler_config.json: Qwen-Image's grid needs use_dynamic_shifting")
        if raw.get("time_shift_type", "exponential") not in ("exponential", "linear"):
            raise ValueError(f"scheduler_config.json: time_shift_type {raw['time_shift_type']!r}")
        fields = set(cls.__struct_fields__)
        return msgspec.convert({k: v for k, v in raw.items() if k in fields}, cls)

    def mu(self, image_seq_len: int) -> float:
        slope = (self.max_shift - self.base_shift) / (self.max_image_seq_len - self.base_image_seq_len)
        return image_seq_len * slope + (self.base_shift - slope * self.base_image_seq_len)

    def sigmas(self, num_steps: int, image_seq_len: int) -> torch.Tensor:
        """float32 [num_steps + 1]: the shifted sigmas, then 0."""
        s = np.linspace(1.0, 1.0 / num_steps, num_steps).astype(np.float32)
        t = torch.from_numpy(s)
        mu = self.mu(image_seq_len)
        if self.time_shift_type == "exponential":
            e = torch.tensor(math.exp(mu), dtype=torch.float32)
            t = e / (e + (1 / t - 1))
        else:
            m = torch.tensor(mu, dtype=torch.float32)
            t = m / (m + (1 / t - 1))
        if self.shift_terminal:
            rest = 1 - t
            scale = rest[-1] / torch.tensor(1 - self.shift_terminal, dtype=torch.float32)
            t = 1 - rest / scale
        return torch.cat([t, torch.zeros(1)])

    def model_time(self, sigma: torch.Tensor) -> torch.Tensor:
        """The DiT's timestep input for sigma: (sigma * T) / T in float32, as the reference
        feeds it (not always sigma itself, to the last bit)."""
        scaled = sigma * self.num_train_timesteps
        return scaled / 1000
