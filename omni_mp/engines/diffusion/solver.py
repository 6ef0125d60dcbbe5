"""Time grids and batched ODE solver steps for flow matching.

Each request has its own grid (steps and sway are per request), so a batched step takes a
time pair per row: rows at different points of their solves share one model call. The RK4
step is transformers' `RungeKutta4ODESolver` (3/8 rule) written for per-row times; the same
operations in the same order, so a batch of one reproduces it bit for bit on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (t [B], x [B, ...]) -> dx/dt

MODEL_CALLS = {"rk4": 4, "euler": 1}


def time_grid(num_steps: int, sway: float | None) -> torch.Tensor:
    """`num_steps` time points from 0 to 1 (fp32, CPU), warped like transformers' token2wav."""
    t = torch.linspace(0, 1, num_steps, dtype=torch.float32)
    if sway is not None:
        t += sway * (torch.cos(math.pi / 2 * t) - 1 + t)
    return t


def _rows(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(-1, *([1] * (like.ndim - 1)))


def rk4_step(f: Velocity, t0: torch.Tensor, t1: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    dt = t1 - t0
    h = _rows(dt, x)
    k1 = f(t0, x)
    k2 = f(t0 + dt * (1 / 3), x + h * k1 * (1 / 3))
    k3 = f(t0 + dt * (2 / 3), x + h * (k2 - k1 * (1 / 3)))
    k4 = f(t1, x + h * (k1 - k2 + k3))
    return x + (k1 + 3 * (k2 + k3) + k4) * h / 8


def euler_step(f: Velocity, t0: torch.Tensor, t1: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return euler_update(x, t0, t1, f(t0, x))


def euler_update(x: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An Euler step's update, given the velocity at (t0, x) (computed elsewhere: in parts)."""
    return x + _rows(t1 - t0, x) * v


SOLVERS = {"rk4": rk4_step, "euler": euler_step}
