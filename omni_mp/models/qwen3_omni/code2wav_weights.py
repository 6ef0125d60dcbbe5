"""Audible random weights for a Qwen3-Omni code2wav (tiny checkpoints, benchmarks).

transformers' default init leaves code2wav nearly silent (layer scales 0.01, ConvNeXt gammas
1e-6, SnakeBeta alpha = beta = 0: random codes give samples of rms ~3e-7), so an oracle test
on it would pass whatever the streaming did. `init_code2wav` draws weights under which every
part matters: unit-variance code embeddings, matrices ~ N(0, 1/fan_in), layer scales and
gammas 0.5 (the transformer's 8 x 71-frame reach is then felt), SnakeBeta alpha/beta
~ N(0, 0.3), and the last convolution scaled so that random codes give rms `TARGET_RMS` (well
inside the [-1, 1] clamp).
"""

from __future__ import annotations

from typing import Any

TARGET_RMS = 0.1


def init_code2wav(code2wav: Any, seed: int = 0, rms: float = TARGET_RMS) -> None:
    """Redraw a `Qwen3OmniMoeCode2Wav`'s weights in place (module docstring)."""
    import torch

    device = next(code2wav.parameters()).device
    gen = torch.Generator(device).manual_seed(seed)  # draws where the weights are (a CUDA build too)
    with torch.no_grad():
        for name, p in sorted(code2wav.named_parameters()):
            leaf = name.rsplit(".", 1)[-1]
            if name.startswith("code_embedding"):
                p.normal_(0.0, 1.0, generator=gen)
            elif leaf in ("alpha", "beta"):
                p.normal_(0.0, 0.3, generator=gen)
            elif leaf in ("scale", "gamma"):
                p.fill_(0.5)
            elif p.ndim >= 2:
                fan_in = p.shape[0] * p.shape[2] if _is_transposed(code2wav, name) else p[0].numel()
                p.normal_(0.0, fan_in**-0.5, generator=gen)
            elif leaf == "bias":
                p.zero_()
        last = code2wav.decoder[-1].conv
        shape = (2, code2wav.config.num_quantizers, 40)
        codes = torch.randint(0, code2wav.config.codebook_size, shape, generator=gen, device=device)
        last.weight.mul_(1e-3)  # far inside the clamp at 1, where the output is linear in it
        raw = code2wav(codes)
        last.weight.mul_(rms / raw.pow(2).mean().sqrt())


def _is_transposed(model: Any, name: str) -> bool:
    import torch

    module = model.get_submodule(name.rsplit(".", 1)[0])
    return isinstance(module, torch.nn.ConvTranspose1d)
