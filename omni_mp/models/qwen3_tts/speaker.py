"""Qwen3-TTS Base's speaker encoder (`speaker_encoder.*`): the x-vector of a reference clip that takes
the preset voice's place in the talker's prompt (cloning, docs/qwen3_tts.md).

The network is an ECAPA-TDNN with the same modules and tensor names as transformers'
Qwen2.5-Omni `ECAPA_TimeDelayNet`, which runs it here. Its input is the reference's log-mel
spectrogram of 24 kHz audio: 128 slaney mel bins (transformers' `mel_filter_bank`, librosa's
slaney filters) over |STFT| (n_fft 1024, Hann window 1024, hop 256, no centring, the signal
reflect-padded by (n_fft - hop) / 2 on each side, magnitude sqrt(re^2 + im^2 + 1e-9)), 0-12 kHz,
log of the values clamped at 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from omni_mp.models.checkpoint import load_prefixed

SAMPLE_RATE = 24000
N_FFT, HOP, WIN, N_MELS, F_MAX = 1024, 256, 1024, 128, 12000


def log_mel(samples: torch.Tensor) -> torch.Tensor:
    """float32 [n] at 24 kHz -> [frames, 128] log-mel (the module docstring)."""
    from transformers.audio_utils import mel_filter_bank

    filters = mel_filter_bank(N_FFT // 2 + 1, N_MELS, 0.0, F_MAX, SAMPLE_RATE, norm="slaney", mel_scale="slaney")
    pad = (N_FFT - HOP) // 2
    x = torch.nn.functional.pad(samples[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(x, N_FFT, HOP, WIN, torch.hann_window(WIN), center=False, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)[0]  # [bins, frames]
    mel = torch.from_numpy(np.asarray(filters, dtype=np.float32)).T @ mag
    return torch.log(mel.clamp(min=1e-5)).T


class SpeakerEncoder:
    """The checkpoint's speaker encoder, fp32 on the CPU (the entry stage's preparing thread)."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniDiTConfig
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import ECAPA_TimeDelayNet

        config = json.loads((Path(model_dir) / "config.json").read_text())
        if config.get("tts_model_type") != "base":
            raise ValueError(f"{model_dir}: not a Base checkpoint (tts_model_type {config.get('tts_model_type')!r})")
        s = config["speaker_encoder_config"]
        keys = ("mel_dim", "enc_dim", "enc_channels", "enc_kernel_sizes", "enc_dilations", "enc_attention_channels",
                "enc_res2net_scale", "enc_se_channels")  # fmt: skip
        self.net = ECAPA_TimeDelayNet(Qwen2_5OmniDiTConfig(**{k: s[k] for k in keys if k in s})).eval()
        state = load_prefixed(model_dir, "speaker_encoder.")
        missing, unexpected = self.net.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{model_dir}: speaker encoder weights do not match: missing {missing}, unexpected {unexpected}"
            )

    @torch.no_grad()
    def embed(self, samples: torch.Tensor) -> torch.Tensor:
        """float32 [n] at 24 kHz -> the x-vector [enc_dim] (the talker's hidden width)."""
        return self.net(log_mel(samples.float())[None])[0]
