"""Qwen3-TTS Base cloning on the entry stage: a reference clip -> what the talker's prompt takes in
the preset voice's place (docs/qwen3_tts.md, "Cloning"), on the stage's preparing thread.

- the clip's rules, checked before anything is computed: at least MIN_CLIP_S and at most
  MAX_CLIP_S seconds (the longest is also the stage's media limit: refused before decoding),
  a rate of at least MIN_CLIP_RATE, not silent (RMS above SILENT_DBFS); it arrives mono (the HTTP
  server down-mixes by the channels' mean, as the reference does) and is resampled to 24 kHz with
  the project's resampler (libsoxr HQ: the reference's librosa default `soxr_hq`);
- x-vector mode: the speaker encoder's x-vector (omni_mp.models.qwen3_tts.speaker);
- in-context mode (a reference text given): the x-vector and the clip's codes (clip_codes).

What reuse costs: each stage process keeps the last MAX_CACHED prompts keyed by a digest of the
clip's samples, rate and mode, so a stored voice (POST /v1/audio/voices) or a clip sent again
runs neither encoder again.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path

import msgspec
import numpy as np
import torch

from omni_mp.media.audio_io import resample

SAMPLE_RATE = 24000
MIN_CLIP_S = 1.0
MAX_CLIP_S = 30.0
MIN_CLIP_RATE = 8000  # below, the clip lacks the 0-12 kHz band the speaker encoder's mel reads
SILENT_DBFS = -60.0  # the clip's RMS at or below this: nothing to clone
MAX_CACHED = 64


class CloneError(ValueError):
    """A reference clip or cloning field this model cannot use (the message names which)."""


class ClonePrompt(msgspec.Struct, frozen=True):
    speaker_embedding: torch.Tensor  # [hidden] float32
    ref_codes: torch.Tensor | None = None  # [frames, 16] int64: in-context mode


def check_clip(samples: np.ndarray, rate: int) -> None:
    """The clip's rules (module docstring); CloneError naming the one broken."""
    seconds = samples.size / rate
    if rate < MIN_CLIP_RATE:
        raise CloneError(f"ref_audio: sample rate {rate} Hz is below {MIN_CLIP_RATE} Hz")
    if seconds < MIN_CLIP_S:
        raise CloneError(f"ref_audio: {seconds:.2f} s is too short (at least {MIN_CLIP_S:g} s)")
    if seconds > MAX_CLIP_S:
        raise CloneError(f"ref_audio: {seconds:.2f} s is too long (at most {MAX_CLIP_S:g} s)")
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    db = 20 * np.log10(rms) if rms > 0 else float("-inf")
    if db <= SILENT_DBFS:
        raise CloneError(f"ref_audio: the clip is silent (RMS {db:.1f} dBFS, at most {SILENT_DBFS:g})")


class VoiceCloner:
    """The checkpoint's speaker encoder and clip encoder (loaded on first use) and the cache."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self._lock = threading.Lock()
        self._speaker = None
        self._clip = None
        self._cache: OrderedDict[bytes, ClonePrompt] = OrderedDict()

    def prompt(self, samples: np.ndarray, rate: int, in_context: bool) -> ClonePrompt:
        check_clip(samples, rate)
        key = hashlib.sha256(np.ascontiguousarray(samples, dtype=np.float32).tobytes())
        key.update(f"{rate}:{in_context}".encode())
        digest = key.digest()
        with self._lock:
            if (hit := self._cache.get(digest)) is not None:
                self._cache.move_to_end(digest)
                return hit
        got = self._compute(torch.from_numpy(resample(samples, rate, SAMPLE_RATE)), in_context)
        with self._lock:
            self._cache[digest] = got
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        return got

    def _compute(self, clip: torch.Tensor, in_context: bool) -> ClonePrompt:
        from omni_mp.models.qwen3_tts.clip_codes import ClipEncoder
        from omni_mp.models.qwen3_tts.speaker import SpeakerEncoder

        if self._speaker is None:
            self._speaker = SpeakerEncoder(self.model_dir)
        embedding = self._speaker.embed(clip)
        if not in_context:
            return ClonePrompt(speaker_embedding=embedding)
        if self._clip is None:
            self._clip = ClipEncoder(self.model_dir)
        return ClonePrompt(speaker_embedding=embedding, ref_codes=self._clip.codes(clip))
