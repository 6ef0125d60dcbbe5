"""Qwen3-Omni code2wav as a streaming window decoder (`engines.diffusion.model.WindowDecoder`):
transformers' modules (`Qwen3OmniMoeCode2Wav`: code embeddings, the 8-layer sliding-window
transformer, the causal upsampler and SnakeBeta decoder), run chunk by chunk, batched across
requests, with the same output as transformers' one-shot `forward` on all of a request's codes.

Input ids are codes, 16 per 80 ms frame (group 0..15 of frame 0, then of frame 1, ...): the
talker's order. Streaming sizes are in codes, multiples of 16 (`window_align`).

Why a chunk equals the one-shot pass (measured by tests/test_qwen3_omni_code2wav.py):
- the transformer is causal with a 72-frame sliding window over 8 layers, so a frame depends on
  the 568 frames before it: no affordable left context makes a recomputed window exact. It runs
  incrementally instead: each request keeps, per layer, the rotated keys and values of its last
  71 frames (what the next frames attend to), and a chunk runs only its new frames at their
  absolute positions (exact up to float summation order);
- the convolutional part (upsampler + decoder) runs incrementally too (code2wav_convs.py):
  each request keeps the last inputs of each convolution, and a chunk runs only its new
  frames. Its transposed convolutions look less than a third of a frame ahead (T frames give
  1920 T - 555 samples; sample j depends on frames up to (j + 554) / 1920), so a window
  reaches one frame past what it emits (`right_context` 16 codes) and the samples it emits are
  exactly the one-shot samples: the join is a plain concatenation, no crossfade needed
  (`crossfade_ms: 0`). Each request keeps the samples made past its last window's start (at
  most a window's), which the next window, starting at that frame, returns again.
Windows of one step share one transformer call (padded; the mask keeps rows apart) and one
convolution call per number of new frames (convolutions over a padded row would see the
padding through the look-ahead); a request's first chunk runs apart from later ones.

CUDA graphs (`use_graphs`, the diffusion runner's `GraphSet`): eager, a chunk is about 1,200
small kernels (half transformer, half convolutions; 5 GFLOP of arithmetic a frame), so a step
is bound by launching them, not by the GPU: on one H200, 36-43 ms a step at one request
whatever its frames. Graphed, each half replays as one launch. The transformer's call is padded
to a row bucket, to the largest streamed chunk's frames and to the full 71 cached frames (the
mask hides the padding, so one graph per row bucket serves every step of a stream); the
convolutions' calls to a row bucket (rows are independent), one graph per (rows, new frames,
first call) of the streamed chunk sizes. Other shapes (a stream's short last chunk, one-shot
windows) run eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from omni_mp.engines.diffusion.graphs import bucket
from omni_mp.engines.diffusion.model import DiffusionInputError, Window
from omni_mp.engines.diffusion.params import DiffusionParams, StreamingConfig
from omni_mp.models.checkpoint import load_prefixed
from omni_mp.models.qwen3_omni.code2wav_convs import StreamingConvs

SAMPLE_RATE = 24000  # 1920 samples per 12.5 Hz frame


class Code2WavOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The `diffusion.model_options:` of a code2wav-shaped decoder stage (`qwen3_omni_code2wav`,
    `qwen3_tts_codec`)."""

    # Each SnakeBeta of the convolutions as one Triton kernel (snake_triton.py) rather than
    # transformers' nine; the same arithmetic. None: on for a CUDA device (Triton), off elsewhere.
    fused_snake: bool | None = None

    def fused_snake_on(self, device: torch.device) -> bool:
        if self.fused_snake and device.type != "cuda":
            raise ValueError(f"code2wav: fused_snake runs Triton kernels, which need a CUDA device, not {device}")
        return device.type == "cuda" if self.fused_snake is None else self.fused_snake


def streamed_shapes(streaming: StreamingConfig, groups: int) -> tuple[int, list[tuple[int, bool]]]:
    """A stream's calls under `streaming`: the most new frames a transformer call runs, and the
    convolutions' (new frames, first call) shapes. A stream's first window runs all its frames;
    each later one the frames of its chunk (its first frame was the window before's
    look-ahead). Its last chunk may be shorter (not listed)."""
    first = -(-(streaming.first_chunk + streaming.right_context) // groups)
    later = sorted({streaming.chunk_at(i) // groups for i in range(1, 64)})
    return max(first, *later), [(first, True), *((n, False) for n in later)]


@dataclass(frozen=True, slots=True)
class Code2WavWindow:
    """One chunk: codes of frames [start, end) of its request."""

    request_id: str
    codes: torch.Tensor  # int64 [groups, end - start]
    start: int
    end: int


@dataclass
class _Stream:
    """What a request keeps between its chunks."""

    frames: int = 0  # frames the transformer and the convolutions have run
    # the frame the transformer's positions count from (a decoder that restarts a request's state
    # mid-request, e.g. Qwen3-TTS's chunked decode, starts a new stream there)
    origin: int = 0
    # [layers, 2 (keys, values), heads, <= window - 1, head_dim]: rotated, of its last frames
    kv: torch.Tensor | None = None
    convs: torch.Tensor | None = None  # [state_size] the convolutions' kept inputs (StreamingConvs.run)
    # float32 CPU one-shot samples [samples_start, made): from the last window's first frame on
    samples: torch.Tensor | None = None
    samples_start: int = 0


class _PastKV:
    """The `past_key_values` transformers' attention layers call `update` on: the cached keys
    and values of a batch (padded), concatenated with the step's new ones."""

    def __init__(self, kv: torch.Tensor) -> None:
        self.kv = kv  # [rows, layers, 2, heads, cached, head_dim]
        self.new: list[torch.Tensor] = [kv] * kv.shape[1]  # per layer [rows, 2, heads, new, head_dim]

    def update(
        self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.new[layer_idx] = torch.stack([k, v], dim=1)
        past = self.kv[:, layer_idx]
        return torch.cat([past[:, 0], k], dim=2), torch.cat([past[:, 1], v], dim=2)


class Code2WavModel:
    """code2wav on one device (fp32, as transformers' oracle runs it; `dtype` for speed runs)."""

    frames_per_input = 1  # the engine's "frames" are codes here (no state to sample)

    def __init__(
        self,
        hf_code2wav: Any,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        options: Code2WavOptions | None = None,
    ) -> None:
        self.device = device
        self.options = options or Code2WavOptions()
        self.dtype = dtype
        self.hf = hf_code2wav.to(device=device, dtype=dtype).eval()
        cfg = self.hf.config
        self.groups: int = cfg.num_quantizers
        self.codebook_size: int = cfg.codebook_size
        self.sliding_window: int = cfg.sliding_window
        self.frame_samples = 1
        for rate in (*cfg.upsample_rates, *cfg.upsampling_ratios):
            self.frame_samples *= rate
        self.sample_rate = SAMPLE_RATE
        self.samples_per_input = self.frame_samples // self.groups  # per code: the join works in codes
        if self.samples_per_input * self.groups != self.frame_samples:
            raise ValueError(f"code2wav: {self.frame_samples} samples per frame do not split over {self.groups} codes")
        self.window_align = self.groups  # windows start on frames
        self.max_frames = cfg.max_position_embeddings * self.groups  # in codes
        self.streams: dict[str, _Stream] = {}
        tr = self.hf.pre_transformer
        self.layers = list(tr.layers[: cfg.num_hidden_layers])
        attn = self.layers[0].self_attn
        self.heads, self.head_dim = cfg.num_key_value_heads, attn.head_dim
        self.convs = StreamingConvs(self.hf, fused_snake=self.options.fused_snake_on(device))
        if self.convs.samples_per_frame != self.frame_samples:
            raise ValueError(
                f"code2wav: {self.convs.samples_per_frame} samples per frame, expected {self.frame_samples}"
            )
        self.keep = self.sliding_window - 1  # cached frames a request's later frames attend to
        # CUDA graphs (use_graphs): the graphed calls, row buckets, and the frames they serve
        # (warm_up_graphs; None: any shape, captured on first use)
        self._attend_fn: Any = self._attend
        self._convs_fn: Any = self.convs.run
        self._rows: tuple[int, ...] | None = None
        self._attend_frames: int | None = None  # the transformer's padded frames when graphed
        self._conv_shapes: frozenset[tuple[int, bool]] | None = None  # (new frames, first call)

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, device: torch.device, **options: Any) -> Code2WavModel:
        opts = msgspec.convert(options, Code2WavOptions)
        from transformers import AutoConfig
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

        model_dir = Path(model_dir)
        config = AutoConfig.from_pretrained(model_dir).code2wav_config
        config._attn_implementation = "sdpa"
        with torch.device(device):
            hf = Qwen3OmniMoeCode2Wav._from_config(config, dtype=torch.float32)
        state = load_prefixed(model_dir, "code2wav.")
        if not state:
            raise ValueError(f"{model_dir}: no `code2wav.*` weights (is it a Qwen3-Omni checkpoint?)")
        missing, unexpected = hf.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{model_dir}: code2wav weights do not match: missing {missing}, unexpected {unexpected}")
        return cls(hf, device, options=opts)

    # ---- WindowDecoder --------------------------------------------------------------------------
    def check(self, params: DiffusionParams, ids: Sequence[int]) -> None:
        bad = next((c for c in ids if not 0 <= c < self.codebook_size), None)
        if bad is not None:
            raise DiffusionInputError(f"code {bad} out of range [0, {self.codebook_size})")

    def condition(self, window: Window) -> Code2WavWindow:
        n = window.ids.numel()
        if n % self.groups or window.start % self.groups:
            raise DiffusionInputError(
                f"code2wav takes {self.groups} codes per frame; the input ends inside a frame "
                f"({window.start + n} codes)"
            )
        start = window.start // self.groups
        codes = window.ids.view(-1, self.groups).T.to(self.device)
        return Code2WavWindow(window.request_id, codes, start, start + codes.shape[1])

    def release(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    # ---- CUDA graphs ----------------------------------------------------------------------------
    def use_graphs(self, graphs: Any, row_buckets: Sequence[int]) -> None:
        """Run both halves from CUDA graphs of `graphs` (omni_mp.engines.diffusion.graphs.GraphSet)."""
        self._rows = tuple(sorted(row_buckets))
        self._attend_fn = graphs.wrap(self._attend, "code2wav transformer")
        self._convs_fn = graphs.wrap(self.convs.run, "code2wav convolutions")

    @torch.no_grad()
    def warm_up_graphs(self, streaming: StreamingConfig, rows: Sequence[int]) -> int:
        """Capture now the graphs a stream's steps replay (`streamed_shapes`) at these row buckets,
        largest first (smaller ones then reuse the shared pool's blocks); from then on other
        shapes run eagerly. Returns how many graphs are ready."""
        if self._rows is None:
            return 0
        frames, shapes = streamed_shapes(streaming, self.groups)
        self._attend_frames, self._conv_shapes = frames, frozenset(shapes)
        dev, ready, width = self.device, 0, self.hf.config.hidden_size
        for r in sorted((b for b in self._rows if b <= max(rows)), reverse=True):
            zeros = torch.zeros(r, dtype=torch.long, device=dev)
            codes = torch.zeros(r, self.groups, frames, dtype=torch.long, device=dev)
            kv = torch.zeros(r, len(self.layers), 2, self.heads, self.keep, self.head_dim, device=dev, dtype=self.dtype)
            ready += bool(self._attend_fn.ready(codes, zeros, zeros, zeros, kv, *self._front_inputs([], r)))
            for n, first in sorted(shapes, reverse=True):
                hidden = torch.zeros(r, width, n, device=dev, dtype=self.dtype)
                kept = None if first else torch.zeros(r, self.convs.state_size, device=dev, dtype=self.dtype)
                ready += bool(self._convs_fn.ready(hidden, kept))
        return ready

    def _graph_rows(self, rows: int) -> int | None:
        """The row bucket a graphed call of `rows` rows is padded to (None: not graphed)."""
        return None if self._rows is None else bucket(rows, self._rows)

    @torch.no_grad()
    def decode_windows(self, windows: Sequence[Code2WavWindow]) -> list[torch.Tensor]:
        """Audio (float32 [samples], CPU) of each window from its first frame on: one-shot samples
        [1920 start, 1920 end - 555) of its request. A request's windows come in order; two of
        one request in one call run in successive rounds."""
        out: list[torch.Tensor | None] = [None] * len(windows)
        pending = list(range(len(windows)))
        while pending:
            seen: set[str] = set()
            now = [i for i in pending if not (windows[i].request_id in seen or seen.add(windows[i].request_id))]
            pending = [i for i in pending if i not in now]
            for i, wav in zip(now, self._round([windows[i] for i in now]), strict=True):
                out[i] = wav
        return out  # type: ignore[return-value]

    def _round(self, windows: list[Code2WavWindow]) -> list[torch.Tensor]:
        streams = []
        for w in windows:
            st = self.streams.setdefault(w.request_id, _Stream())
            if not w.start <= st.frames <= w.end:
                raise RuntimeError(f"request {w.request_id}: window [{w.start}, {w.end}) after {st.frames} frames")
            streams.append(st)
        new = self._transformer(windows, streams)
        self._convolutions(windows, streams, new)
        out = []
        for w, st in zip(windows, streams, strict=True):  # later windows start at or after this one
            assert st.samples is not None
            start = w.start * self.frame_samples
            out.append(st.samples[start - st.samples_start :])
            st.samples, st.samples_start = st.samples[start - st.samples_start :], start
        return out

    # ---- the transformer, incrementally ---------------------------------------------------------
    def _transformer(self, windows: list[Code2WavWindow], streams: list[_Stream]) -> list[torch.Tensor | None]:
        """Run each window's new frames through the transformer, after the keys and values its
        request cached: their outputs [new frames, hidden] per window (None: nothing new)."""
        out: list[torch.Tensor | None] = [None] * len(windows)
        at = [i for i, (w, st) in enumerate(zip(windows, streams, strict=True)) if w.end > st.frames]
        rows = [(windows[i], streams[i]) for i in at]
        if not rows:
            return out
        dev = self.device
        new = [w.end - st.frames for w, st in rows]
        cached = [0 if st.kv is None else st.kv.shape[3] for _, st in rows]
        # graphed: rows to a bucket, frames to the streamed maximum, cache to its full length
        padded = self._graph_rows(len(rows))
        graphed = padded is not None and (self._attend_frames is None or max(new) <= self._attend_frames)
        n_rows = padded if graphed else len(rows)
        n = (self._attend_frames or max(new)) if graphed else max(new)
        c = self.keep if graphed else max(cached)
        codes = torch.zeros(n_rows, self.groups, n, dtype=torch.long, device=dev)
        kv = torch.zeros(n_rows, len(self.layers), 2, self.heads, c, self.head_dim, device=dev, dtype=self.dtype)
        for i, (w, st) in enumerate(rows):
            codes[i, :, : new[i]] = w.codes[:, st.frames - w.start :]
            if st.kv is not None:
                kv[i, :, :, :, : cached[i]] = st.kv
        pad = [0] * (n_rows - len(rows))
        first, n_cached, n_new = (
            torch.tensor(v + pad, device=dev) for v in ([st.frames - st.origin for _, st in rows], cached, new)
        )
        front = self._front_inputs([st for _, st in rows], n_rows)
        h, new_kv, *front_out = (self._attend_fn if graphed else self._attend)(
            codes, first, n_cached, n_new, kv, *front
        )
        for i, (_, st) in enumerate(rows):
            m = new[i]
            kept = torch.cat([kv[i, :, :, :, : cached[i]], new_kv[i, :, :, :, :m]], dim=3)
            st.kv = kept[:, :, :, -self.keep :].clone()  # only the last `keep` frames stay alive
            self._keep_front_state(st, i, m, front, front_out)
            out[at[i]] = h[i, :m]
        return out

    def _front_inputs(self, streams: list[_Stream], rows: int) -> tuple[torch.Tensor, ...]:
        """Extra per-row inputs of `_attend` that a subclass's front keeps per stream, for `rows`
        rows (`streams` first, zeros after): none here."""
        return ()

    def _keep_front_state(
        self, st: _Stream, row: int, new: int, inputs: tuple[torch.Tensor, ...], outputs: list[torch.Tensor]
    ) -> None:
        """Keep what a subclass's front needs of this call for the stream's next one: nothing here."""

    def _attend(
        self, codes: torch.Tensor, first: torch.Tensor, cached: torch.Tensor, new: torch.Tensor, kv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The transformer over a padded batch, tensors only (capture-safe): codes [rows, groups,
        n], each row's first new frame, cached and new frame counts [rows], its cached keys and
        values [rows, layers, 2, heads, c, head_dim] (the first `cached` of c valid). Returns the
        outputs [rows, n, hidden] and the new keys and values [rows, layers, 2, heads, n, head_dim]."""
        hf = self.hf
        x = hf.code_embedding(codes + hf.code_offset).mean(1)  # [rows, n, hidden]
        q_pos = first[:, None] + torch.arange(codes.shape[2], device=codes.device)  # absolute frame positions
        past = _PastKV(kv)
        mask = self._mask(first, q_pos, cached, new, kv.shape[4])
        pe = hf.pre_transformer.rotary_emb(x, q_pos)
        h = x
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_embeddings=pe, past_key_values=past)
        return hf.pre_transformer.norm(h), torch.stack(past.new, dim=1)

    def _mask(
        self, first: torch.Tensor, q_pos: torch.Tensor, cached: torch.Tensor, new: torch.Tensor, c: int
    ) -> torch.Tensor:
        """[rows, 1, n, c + n] bool: a query sees the valid keys of its row at most
        `sliding_window - 1` frames back (transformers' sliding window: q - k < window)."""
        dev, n = q_pos.device, q_pos.shape[1]
        slot = torch.arange(c, device=dev)[None]
        k_pos = torch.cat([first[:, None] - cached[:, None] + slot, q_pos], dim=1)
        k_valid = torch.cat([slot < cached[:, None], torch.arange(n, device=dev)[None] < new[:, None]], dim=1)
        dist = q_pos[:, :, None] - k_pos[:, None, :]
        mask = k_valid[:, None, :] & (dist >= 0) & (dist < self.sliding_window)
        mask[:, :, c:] |= torch.eye(n, dtype=torch.bool, device=dev)  # padded queries keep themselves
        return mask[:, None]

    # ---- the convolutions, incrementally ----------------------------------------------------------
    def _convolutions(
        self, windows: list[Code2WavWindow], streams: list[_Stream], new: list[torch.Tensor | None]
    ) -> None:
        """Run each window's new transformer outputs through the convolutions, after the inputs
        its request kept; append the samples to the request's. One call per (new frames, first
        call of its stream): rows of one call have one shape at every layer."""
        groups: dict[tuple[int, bool], list[int]] = {}
        for i, h in enumerate(new):
            if h is not None:
                groups.setdefault((h.shape[0], streams[i].convs is None), []).append(i)
        for (frames, first), idx in groups.items():
            rows: list[torch.Tensor] = [new[i] for i in idx]  # type: ignore[misc]
            kept_rows = [] if first else [streams[i].convs for i in idx]
            run = self.convs.run
            padded = self._graph_rows(len(idx))
            if padded is not None and (self._conv_shapes is None or (frames, first) in self._conv_shapes):
                run = self._convs_fn
                pad = padded - len(idx)  # zero rows: independent of the real ones
                rows += [rows[0].new_zeros(rows[0].shape)] * pad
                kept_rows += [kept_rows[0].new_zeros(kept_rows[0].shape)] * pad if kept_rows else []
            hidden = torch.stack(rows).permute(0, 2, 1)
            wav, state = run(hidden, None if first else torch.stack(kept_rows))  # type: ignore[arg-type]
            wav = wav[: len(idx)].clamp(min=-1, max=1).to(device="cpu", dtype=torch.float32)
            # Copies, not views: a view would keep its whole batch alive for as long as its stream
            # waits for frames (streams waiting in different steps: up to one batch each).
            for i, kept_row, samples in zip(idx, state[: len(idx)].unbind(0), wav.unbind(0), strict=True):
                st = streams[i]
                st.convs = kept_row.clone()
                st.samples = samples.clone() if st.samples is None else torch.cat([st.samples, samples])
                st.frames += frames
