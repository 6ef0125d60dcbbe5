"""Server VAD: the Silero VAD model that the `silero-vad` package ships (its ONNX file, run by
onnxruntime on CPU), one model per process, the recurrent state per session.

silero-vad's own `OnnxWrapper`/`VADIterator` keep the recurrent state inside the model object,
so sharing one model between sessions would mix their states, and a wrapper per session would
load one ONNX session per session. Here the process's one `InferenceSession` runs every
session's frames and each `Detector` keeps its own state and context (the same inputs the
wrapper builds: 64 samples of context + 512 new ones at 16 kHz, the model's `state` tensor).

Turn rules (OpenAI's server_vad): speech starts at the first frame whose probability is >=
`threshold`; `audio_start_ms` is that frame's start less `prefix_padding_ms` (what the model
gets). It stops once frames stay below `threshold - 0.15` (Silero's own hysteresis) for
`silence_duration_ms`; `audio_end_ms` is that moment. Times are milliseconds of the audio the
client sent in this session."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import numpy as np

RATE = 16_000  # what the model (and Qwen's audio encoders) take
FRAME = 512  # samples per frame at 16 kHz (32 ms): the model's fixed window
_CONTEXT = 64
HYSTERESIS = 0.15


@functools.lru_cache(maxsize=1)
def model() -> object:
    """The process's one Silero VAD session (onnxruntime, CPU, one thread: a frame costs ~0.2 ms)."""
    import onnxruntime

    # The package's file, found on sys.path without importing the package: `silero_vad.model`
    # calls torch.set_num_threads(1) when imported, which would change the whole process's torch.
    path = next(
        (
            p
            for p in (os.path.join(d, "silero_vad", "data", "silero_vad.onnx") for d in sys.path if d)
            if os.path.isfile(p)
        ),
        None,
    )
    if path is None:
        raise RuntimeError("the silero-vad package is not installed (scripts/requirements-cpu.txt)")
    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class VadEvent:
    started: bool  # True: speech started; False: it stopped
    ms: int  # audio_start_ms or audio_end_ms


class Detector:
    """One session's VAD over its 16 kHz audio, fed in pieces of any length."""

    def __init__(self, settings: VadSettings) -> None:
        self.settings = settings
        self._session = model()
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, _CONTEXT), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._samples = 0  # samples run through the model so far
        self._silence = 0  # samples of silence since speech was last heard
        self.speaking = False
        self.frames = 0

    def probability(self, frame: np.ndarray) -> float:
        x = np.concatenate([self._context, frame[None, :]], axis=1)
        out, self._state = self._session.run(  # type: ignore[attr-defined]
            None, {"input": x, "state": self._state, "sr": np.array(RATE, dtype=np.int64)}
        )
        self._context = x[:, -_CONTEXT:]
        self.frames += 1
        return float(out[0, 0])

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        """The events that `samples` (float32, 16 kHz, following the audio fed before) make."""
        s = self.settings
        data = np.concatenate([self._pending, samples.astype(np.float32, copy=False)])
        whole = len(data) // FRAME * FRAME
        self._pending = data[whole:]
        events = []
        for i in range(0, whole, FRAME):
            p = self.probability(data[i : i + FRAME])
            start = self._samples
            self._samples += FRAME
            if p >= s.threshold:
                self._silence = 0
                if not self.speaking:
                    self.speaking = True
                    events.append(VadEvent(True, max(0, start * 1000 // RATE - s.prefix_padding_ms)))
            elif self.speaking and p < s.threshold - HYSTERESIS:
                self._silence += FRAME
                if self._silence * 1000 >= s.silence_duration_ms * RATE:
                    self.speaking, self._silence = False, 0
                    events.append(VadEvent(False, self._samples * 1000 // RATE))
        return events
