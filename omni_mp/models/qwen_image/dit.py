"""Qwen-Image's DiT and VAE as a diffusion-engine model (`diffusion.model_type: qwen_image`).

A request is one image: its trajectory is the packed latent [tokens, 64] (16 latent channels
in 2x2 patches; tokens = height/16 * width/16), started from seeded CPU noise drawn as
[1, 1, 16, height/8, width/8] and packed, solved by flow-match Euler over the request's own
shifted sigma grid (`schedule`), then unpacked, de-normalized and decoded by the VAE to uint8
RGB. The engine batches trajectories between steps; this model evaluates one step's batch:

- trajectories share a transformer call only when their image size is the same (the DiT's
  RoPE is per batch, not per row): the engine groups by `TrajectoryStart.group`.
- within a size group, rows are split into transformer calls by text length (`calls`): rows
  of one length share a call with no mask (SDPA's flash kernel); rows of different lengths
  share a call only where the cost model says so, right-padded with a key-padding mask (the
  DiT masks padded text keys in its joint attention; image tokens are never padded).
- true CFG: rows whose request has a negative prompt (and scale > 1) get a second row in the
  same step with the negative prompt's rows (in the same call when the plan puts it there); the guided velocity is
  neg + s (cond - neg), rescaled per token to the norm of the conditional prediction.

diffusers' `QwenImageTransformer2DModel` and `AutoencoderKLQwenImage` are the modules; the
batching, masks, packing, grid and guidance are ours.
"""

from __future__ import annotations

import random
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import torch
from msgspec import Meta

from omni_mp.engines.base import StageInput
from omni_mp.engines.diffusion.model import DiffusionInputError, Preview, TrajectoryStart, Window, run_parts
from omni_mp.models.qwen_image.calls import GPU_COST, CallCost, plan_calls
from omni_mp.models.qwen_image.dit_parts import forward_in_parts, parts_per_call
from omni_mp.models.qwen_image.params import SIZE_MULTIPLE, ImageParams, parse_params
from omni_mp.models.qwen_image.schedule import FlowSchedule
from omni_mp.wire.outputs import image_info

LATENT_CHANNELS = 16
VAE_SCALE = 8  # pixels per latent cell
PATCH = 2  # latent cells per packed token side


_DEFAULTS = ImageParams()


class QwenImageOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The `diffusion.model_options:` of a `model_type: qwen_image` stage."""

    max_height: int = 2048  # pixels; larger requests fail at registration
    max_width: int = 2048
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"  # the DiT's and VAE's weights
    # A denoising step runs this many DiT blocks per engine step (0: the whole step in one):
    # between parts the stage takes in new requests, and one that arrives early in a step
    # restarts it together with the batch (`diffusion.restart_step_before`), so its first
    # step need not wait for the step in flight to end. 10 of the real model's 60 blocks:
    # a part of a 512x512 step is ~30 ms on an H200.
    blocks_per_part: Annotated[int, Meta(ge=0)] = 10


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[C, h, w] latent cells -> [h/2 * w/2, C * 4] tokens (row-major patches, channel-major inside)."""
    c, h, w = latents.shape
    return latents.view(c, h // PATCH, PATCH, w // PATCH, PATCH).permute(1, 3, 0, 2, 4).reshape(-1, c * PATCH * PATCH)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The inverse of `pack`: [h/2 * w/2, C * 4] -> [C, h, w]."""
    c = tokens.shape[1] // (PATCH * PATCH)
    return tokens.view(h // PATCH, w // PATCH, c, PATCH, PATCH).permute(2, 0, 3, 1, 4).reshape(c, h, w)


def initial_latents(seed: int, height: int, width: int) -> torch.Tensor:
    """The request's starting noise, packed [tokens, 64] (float32, CPU): one CPU generator
    seeded with the request's seed, drawn in the [1, 1, C, h, w] layout of the reference."""
    gen = torch.Generator().manual_seed(seed)
    h, w = height // VAE_SCALE, width // VAE_SCALE
    noise = torch.randn((1, 1, LATENT_CHANNELS, h, w), generator=gen, dtype=torch.float32)
    return pack(noise[0, 0])


@dataclass(frozen=True, slots=True)
class ImageInputs:
    """A request's conditioning: the prompt's rows (template dropped) and, with true CFG,
    the negative prompt's."""

    prompt: torch.Tensor  # [n, text width]
    negative: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class ImageCond:
    prompt: torch.Tensor  # on the model's device, in its dtype
    negative: torch.Tensor | None
    scale: float
    shape: tuple[int, int, int]  # (frames, tokens high, tokens wide) for the DiT's RoPE


@dataclass(frozen=True, slots=True)
class ImageCall:
    """One transformer call of a step: some of the step's rows, their text padded to the longest."""

    rows: torch.Tensor | None  # long [r]: indices into the step's R rows; None: all, in order
    text: torch.Tensor  # [r, L, width]
    mask: torch.Tensor | None  # bool [r, L]; None: every row is L long (no mask, flash SDPA)


@dataclass(frozen=True, slots=True)
class ImageBatch:
    calls: tuple[ImageCall, ...]  # over R rows: B conditional rows, then the negative rows
    cfg_rows: torch.Tensor  # long [K]: the trajectories (of B) that run true CFG
    scales: torch.Tensor  # [K, 1, 1]
    shape: tuple[int, int, int]


class QwenImageModel:
    """DiffusionModel + RequestModel of omni_mp.engines.diffusion.model."""

    sample_rate = 0  # images, not audio
    samples_per_input = 0
    frames_per_input = 0  # requests carry no input ids
    state_dim = LATENT_CHANNELS * PATCH * PATCH
    window_align = 1

    def __init__(
        self,
        transformer: Any,
        vae: Any,
        schedule: FlowSchedule,
        options: QwenImageOptions,
        call_cost: CallCost = GPU_COST,
    ) -> None:
        self.call_cost = call_cost  # how a step's rows are split into transformer calls
        self.transformer = transformer
        self.vae = vae
        self.schedule = schedule
        self.options = options
        self.device: torch.device = next(transformer.parameters()).device
        self.dtype: torch.dtype = next(transformer.parameters()).dtype
        self.text_width: int = transformer.config.joint_attention_dim
        self.max_frames = (options.max_height // 16) * (options.max_width // 16)
        cfg = vae.config
        self._mean = torch.tensor(cfg.latents_mean, dtype=torch.float32).view(-1, 1, 1, 1)
        self._inv_std = 1.0 / torch.tensor(cfg.latents_std, dtype=torch.float32).view(-1, 1, 1, 1)

    @classmethod
    def from_checkpoint(cls, model_dir: str, device: torch.device, **options: Any) -> QwenImageModel:
        from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

        opts = msgspec.convert(options, QwenImageOptions)
        dtype = getattr(torch, opts.dtype)
        root = Path(model_dir)
        transformer = QwenImageTransformer2DModel.from_pretrained(root / "transformer", dtype=dtype)
        vae = AutoencoderKLQwenImage.from_pretrained(root / "vae", dtype=dtype)
        return cls(transformer.to(device).eval(), vae.to(device).eval(), FlowSchedule.from_checkpoint(root), opts)

    # ---- requests ------------------------------------------------------------------------------
    def check_params(self, raw: dict[str, Any] | None) -> ImageParams:
        o = self.options
        if raw is None or isinstance(raw, dict):
            # A side the request leaves out is the released default (1024), capped at this
            # stage's maximum: a default must fit the stage it is sent to (the tiny configs cap 512).
            raw = dict(raw or {})
            for side, cap in (("height", o.max_height), ("width", o.max_width)):
                if side not in raw and getattr(_DEFAULTS, side) > cap:
                    raw[side] = cap - cap % SIZE_MULTIPLE
        try:
            p = parse_params(raw)
        except ValueError as err:
            raise DiffusionInputError(str(err)) from None
        if p.height > o.max_height or p.width > o.max_width:
            raise DiffusionInputError(
                f"image params: {p.height}x{p.width} is larger than this stage's maximum {o.max_height}x{o.max_width}"
            )
        return p

    def _rows(self, what: str, rows: torch.Tensor | None, limit: int) -> torch.Tensor:
        if rows is None or rows.ndim != 2 or rows.shape[1] != self.text_width or rows.shape[0] == 0:
            shape = None if rows is None else list(rows.shape)
            raise DiffusionInputError(f"{what}: expected [n >= 1, {self.text_width}] text rows, got {shape}")
        if not rows.dtype.is_floating_point or not bool(torch.isfinite(rows).all()):
            raise DiffusionInputError(f"{what}: expected finite floating-point rows")
        return rows[:limit].float()

    def parse(self, stage_input: StageInput, seed: int | None) -> tuple[ImageParams, ImageInputs]:
        p = self.check_params(stage_input.params)
        limit = p.max_sequence_length
        prompt = self._rows("prompt rows", stage_input.prompt_embeds, limit)
        negative = None
        if p.cfg:
            if len(stage_input.companions) != 1:
                raise DiffusionInputError("true CFG: expected the negative prompt's rows beside the prompt's")
            negative = self._rows("negative prompt rows", stage_input.companions[0].prompt_embeds, limit)
        seed = p.seed if p.seed is not None else seed
        if seed is None:
            seed = random.SystemRandom().getrandbits(63)
        return msgspec.structs.replace(p, seed=seed), ImageInputs(prompt, negative)

    def start(self, window: Window) -> TrajectoryStart:
        p: ImageParams = window.params
        assert p.seed is not None
        x = initial_latents(p.seed, p.height, p.width)
        tokens = x.shape[0]
        return TrajectoryStart(
            x=x.to(self.device),
            grid=self.schedule.sigmas(p.num_inference_steps, tokens).to(self.device),
            guidance=p.true_cfg_scale if p.cfg else 0.0,
            solver="euler",
            group=(p.height, p.width),
            preview_every=p.preview_every,
        )

    def output_info(self, out: torch.Tensor | Preview) -> dict[str, Any]:
        if isinstance(out, Preview):  # the current latents decoded, after `step` steps
            return image_info(out.out, preview_step=out.step)
        return image_info(out)

    # ---- DiffusionModel --------------------------------------------------------------------------
    def check(self, params: Any, ids: Sequence[int]) -> None:
        return None  # requests are checked by `check_params` and `parse`

    def condition(self, window: Window) -> ImageCond:
        p: ImageParams = window.params
        inputs: ImageInputs = window.inputs
        neg = None if inputs.negative is None else inputs.negative.to(self.device, self.dtype)
        return ImageCond(
            prompt=inputs.prompt.to(self.device, self.dtype),
            negative=neg,
            scale=p.true_cfg_scale,
            shape=(1, p.height // 16, p.width // 16),
        )

    def collate(self, conds: Sequence[ImageCond], guidance: torch.Tensor) -> ImageBatch:
        cfg = [i for i, c in enumerate(conds) if c.negative is not None]
        rows = [c.prompt for c in conds] + [conds[i].negative for i in cfg]  # type: ignore[misc]
        shape = conds[0].shape
        plan = plan_calls([r.shape[0] for r in rows], shape[1] * shape[2], self.call_cost)
        calls = tuple(self._call(rows, idx, len(plan) == 1) for idx in plan)
        return ImageBatch(
            calls=calls,
            cfg_rows=torch.tensor(cfg, dtype=torch.long, device=self.device),
            scales=torch.tensor([conds[i].scale for i in cfg], device=self.device).view(-1, 1, 1),
            shape=shape,
        )

    def _call(self, rows: list[torch.Tensor], idx: list[int], only: bool) -> ImageCall:
        lengths = [rows[i].shape[0] for i in idx]
        longest = max(lengths)
        text = torch.zeros(len(idx), longest, self.text_width, device=self.device, dtype=self.dtype)
        for j, i in enumerate(idx):
            text[j, : lengths[j]] = rows[i]
        mask = None
        if min(lengths) < longest:
            mask = torch.arange(longest, device=self.device)[None] < torch.tensor(lengths, device=self.device)[:, None]
        sel = None if only else torch.tensor(idx, dtype=torch.long, device=self.device)
        return ImageCall(rows=sel, text=text, mask=mask)

    def velocity(self, batch: ImageBatch, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return run_parts(self.velocity_parts(batch, x, t))

    def velocity_parts(
        self, batch: ImageBatch, x: torch.Tensor, t: torch.Tensor
    ) -> Generator[float, None, torch.Tensor]:
        """`velocity`, yielding the fraction of its work done after every `blocks_per_part`
        blocks of each transformer call (the engine runs one part per engine step)."""
        n = x.shape[0]
        k = batch.cfg_rows
        hidden = torch.cat([x, x[k]]) if k.numel() else x
        sigma = torch.cat([t, t[k]]) if k.numel() else t
        hidden = hidden.to(self.dtype)
        time = self.schedule.model_time(sigma.float()).to(self.dtype)
        out: torch.Tensor | None = None
        per_call = parts_per_call(self.transformer, self.options.blocks_per_part)
        total, done = per_call * len(batch.calls), 0
        for call in batch.calls:
            if done and self.options.blocks_per_part:  # between calls: a part ends here too
                yield done / total
            h, tt = (hidden, time) if call.rows is None else (hidden[call.rows], time[call.rows])
            parts = forward_in_parts(
                self.transformer,
                h,
                call.text,
                call.mask,
                tt,
                [[batch.shape]] * h.shape[0],
                self.options.blocks_per_part,
            )
            while True:
                try:
                    next(parts)
                except StopIteration as stop:
                    o = stop.value.float()
                    break
                done += 1
                yield done / total
            done += 1
            if call.rows is None:
                out = o
                break
            if out is None:
                out = torch.empty(hidden.shape[0], *o.shape[1:], device=o.device, dtype=o.dtype)
            out[call.rows] = o
        assert out is not None
        v = out[:n]
        if k.numel():
            cond, neg = v[k], out[n:]
            guided = neg + batch.scales * (cond - neg)
            guided = guided * (cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))
            v = v.clone()
            v[k] = guided
        return v

    def decode(self, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        raise NotImplementedError("an image's size is in its conditioning: the engine calls `render`")

    def render(self, conds: Sequence[ImageCond], states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Packed final latents -> uint8 [H, W, 3] RGB on the CPU (one VAE call per image:
        sizes differ)."""
        return [self._decode_one(c.shape, x) for c, x in zip(conds, states, strict=True)]

    def _decode_one(self, shape: tuple[int, int, int], x: torch.Tensor) -> torch.Tensor:
        h, w = shape[1] * PATCH, shape[2] * PATCH
        lat = unpack(x.float().cpu(), h, w)[:, None]  # [C, 1, h, w]
        lat = lat / self._inv_std + self._mean
        pixels = self.vae.decode(lat[None].to(self.device, self.dtype), return_dict=False)[0][0, :, 0]
        img = (pixels.float().cpu() / 2 + 0.5).clamp(0, 1)
        return (img.permute(1, 2, 0) * 255).round().to(torch.uint8)
