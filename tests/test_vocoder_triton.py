"""BigVGAN's anti-aliased SnakeBeta as Triton kernels (`vocoder_triton.py`, what a CUDA
token2wav stage runs) against transformers' `Qwen2_5OmniAntiAliasedActivation1d`, on the CPU
through Triton's interpreter (`TRITON_INTERPRET=1`, read when the kernels are defined, so the
checks run in processes of their own): every distinct activation of the tiny vocoder, lengths
from one sample (replicate padding reaching across the whole input) to past one tile of the
kernels, and the whole vocoder with the kernels against transformers' BigVGAN forward. The two
checks run side by side (each is one core's work: the interpreter runs program by program)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHECKS = ("activations", "vocoder")


def test_triton_activation_is_transformers() -> None:
    # one thread each: the two processes share the cores (OpenMP threads spin-waiting on a core
    # the other process needs made the pair slower than one after the other)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).resolve().parent.parent

    def run(check: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "tests.test_vocoder_triton", check]
        return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)

    with ThreadPoolExecutor(len(CHECKS)) as pool:
        for check, proc in zip(CHECKS, pool.map(run, CHECKS), strict=True):
            assert proc.returncode == 0, f"{check}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            assert f"checked {check}" in proc.stdout


def _check(which: str) -> None:
    import copy

    import torch

    from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav
    from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel
    from omni_mp.models.qwen2_5_omni.token2wav_fused import AntialiasedSnake
    from omni_mp.models.qwen2_5_omni.vocoder_triton import BLOCK, TritonSnake
    from tests.test_token2wav_fused import distinct_activations

    model = Token2WavModel.from_checkpoint(build_token2wav(TOKEN2WAV_SPECS["tiny-token2wav"]), torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        if which == "activations":
            for act in distinct_activations(model.vocoder, g):
                kernels = TritonSnake(AntialiasedSnake(act))
                for frames in (1, 2, 5, 37, BLOCK + 3):
                    x = torch.randn(2, act.act.in_features, frames, generator=g) * 3
                    want, got = act(x), kernels(x)
                    assert got.shape == want.shape, (got.shape, want.shape)
                    err = float((got - want).abs().max() / want.abs().max())
                    assert err <= 1e-5, (act.act.in_features, frames, err)
        else:  # the whole vocoder with every activation as the kernels
            model.fuse_activations(TritonSnake)
            mel = torch.randn(1, model.state_dim, 6, generator=g) - 4.0
            want = copy.deepcopy(model.vocoder)(mel)  # transformers' BigVGAN forward
            got = model._vocode(mel)
            err = float((got - want).norm() / want.norm())
            assert want.abs().max() > 1e-3 and err <= 1e-5, err
    print(f"checked {which}")


if __name__ == "__main__":
    assert sys.argv[1] in CHECKS, sys.argv
    _check(sys.argv[1])
