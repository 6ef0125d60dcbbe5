"""A reference clip's codes for Qwen3-TTS Base in-context cloning: the speech tokenizer's encoder
(`speech_tokenizer/` `encoder.*`), which is transformers' Mimi encoder (the reference subclasses
`MimiModel` and drops its decoder half), keeping the first `encoder_valid_num_quantizers` (16)
codebooks of each 12.5 Hz frame, and ceil(samples / 1920) frames (docs/qwen3_tts.md).

Runs here with transformers' own `MimiModel` on the checkpoint's encoder weights, fp32 on the CPU
(the entry stage's preparing thread). Input: mono float32 at the tokenizer's 24 kHz.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omni_mp.models.checkpoint import load_prefixed

_DECODER_HALF = ("decoder.", "decoder_transformer.", "upsample.")  # MimiModel's parts the checkpoint lacks


class ClipEncoder:
    """The speech tokenizer's Mimi encoder: `codes(samples)` -> int64 [frames, 16]."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import MimiConfig, MimiModel

        tok_dir = Path(model_dir) / "speech_tokenizer"
        config = json.loads((tok_dir / "config.json").read_text())
        self.quantizers = int(config["encoder_valid_num_quantizers"])
        self.frame_samples = int(config["encode_downsample_rate"])
        self.sample_rate = int(config.get("input_sample_rate", 24000))
        self.net = MimiModel(MimiConfig(**config["encoder_config"])).eval()
        state = {k: v.float() for k, v in load_prefixed(tok_dir, "encoder.").items()}
        missing, unexpected = self.net.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith(_DECODER_HALF)]
        if missing or unexpected or not state:
            raise ValueError(
                f"{tok_dir}: Mimi encoder weights do not match: missing {missing}, unexpected {unexpected}"
            )

    @torch.no_grad()
    def codes(self, samples: torch.Tensor) -> torch.Tensor:
        """float32 [n] at 24 kHz -> int64 [ceil(n / 1920), 16]."""
        out = self.net.encode(samples.float()[None, None], num_quantizers=self.quantizers, return_dict=True)
        frames = -(-samples.numel() // self.frame_samples)
        return out.audio_codes[0, : self.quantizers, :frames].T.contiguous().long()
