"""How a Qwen-Image DiT step splits its rows into transformer calls (`qwen_image/calls.py`).

Rows of one text length run with no key-padding mask (so SDPA may pick its flash kernel on a
GPU); the results must equal those of the masked path. The tiny checkpoint (fp32, CPU, random
weights built by our own code) runs both; the reference for the masked path is diffusers'
transformer called directly with an explicit all-ones mask.

Measured tolerances (CPU, fp32), stated where asserted:
- equal-length rows, no mask vs all-ones mask: 0.0 measured; asserted 1e-5 (the per-step latent
  tolerance of tests/test_qwen_image_engine.py);
- mixed lengths, split into unmasked calls vs one masked padded call: 2.4e-6 measured;
  asserted 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from omni_mp.models.qwen_image.calls import GPU_COST, CallCost, plan_calls
from omni_mp.models.qwen_image.dit import ImageCond, QwenImageModel
from omni_mp.models.registry import resolve_model

ATOL = 1e-5
ALWAYS_SPLIT = CallCost(launch=0.0)  # no launch floor: every length its own unmasked call
NEVER_SPLIT = CallCost(launch=1e12)  # launch-bound everywhere: one (masked) call

SIZE = (1, 4, 4)  # 64x64 pixels: 16 image tokens


@pytest.fixture(scope="module")
def model() -> QwenImageModel:
    return QwenImageModel.from_checkpoint(str(resolve_model("tiny-qwen-image")), torch.device("cpu"), dtype="float32")


def _with_cost(m: QwenImageModel, cost: CallCost) -> QwenImageModel:
    return QwenImageModel(m.transformer, m.vae, m.schedule, m.options, call_cost=cost)


def _conds(m: QwenImageModel, lengths: list[tuple[int, int | None]], seed: int) -> list[ImageCond]:
    gen = torch.Generator().manual_seed(seed)
    w = m.text_width
    out = []
    for n, neg in lengths:
        prompt = torch.randn(n, w, generator=gen)
        negative = None if neg is None else torch.randn(neg, w, generator=gen)
        out.append(ImageCond(prompt=prompt, negative=negative, scale=4.0, shape=SIZE))
    return out


def _state(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, SIZE[1] * SIZE[2], 64, generator=gen)
    t = torch.rand(n, generator=gen) * 0.9 + 0.05
    return x, t


# ---- the rule ----------------------------------------------------------------------------------


def test_equal_lengths_one_call_without_mask(model: QwenImageModel) -> None:
    assert plan_calls([7, 7, 7, 7], 4096) == [[0, 1, 2, 3]]
    assert plan_calls([7, 7], 16) == [[0, 1]]
    for cost in (GPU_COST, ALWAYS_SPLIT, NEVER_SPLIT):
        batch = _with_cost(model, cost).collate(_conds(model, [(9, 9), (9, None), (9, 9)], 0), torch.zeros(3))
        assert len(batch.calls) == 1
        assert batch.calls[0].mask is None and batch.calls[0].rows is None
        assert batch.calls[0].text.shape[:2] == (5, 9)


def test_rule_on_the_gpu_regimes() -> None:
    prompt, negative = 38, 6  # a prompt of a few dozen tokens and a short negative (" ")
    # 512x512 (1024 tokens a row): launch-bound, the CFG pair shares one masked call
    assert plan_calls([prompt, negative], 1024) == [[0, 1]]
    # 1024x1024 (4096 tokens a row): attention-bound, two unmasked calls
    assert sorted(plan_calls([prompt, negative], 4096)) == [[0], [1]]
    # 16 requests at 512x512 with CFG, every prompt a different length: a few calls, not 32
    # (the 16 negative rows in one unmasked call, the prompts in masked calls of ~4 rows: each
    # call has at least a launch floor's work)
    lengths = [20 + 3 * i for i in range(16)] + [negative] * 16
    plan = plan_calls(lengths, 1024)
    assert 1 <= len(plan) <= 6
    assert all(len(c) >= 4 for c in plan)
    assert sorted(r for c in plan for r in c) == list(range(32))
    # the same at 1024x1024: every row's call is compute-bound (4096 tokens), so no call
    # pays for a mask: one call per length, the 16 negative rows sharing one
    plan = plan_calls(lengths, 4096)
    assert len(plan) == 17
    assert all(len({lengths[r] for r in c}) == 1 for c in plan)
    assert list(range(16, 32)) in plan


# ---- the results -------------------------------------------------------------------------------


@torch.inference_mode()
def test_no_mask_equals_masked_for_equal_lengths(model: QwenImageModel) -> None:
    conds = _conds(model, [(11, 11), (11, None), (11, 11)], 1)
    batch = model.collate(conds, torch.zeros(3))
    (call,) = batch.calls
    assert call.mask is None
    x, t = _state(3, 2)
    ours = model.velocity(batch, x, t)
    # the same call through the masked path: diffusers' transformer with an all-ones mask
    k = batch.cfg_rows
    hidden, sigma = torch.cat([x, x[k]]), torch.cat([t, t[k]])
    masked = model.transformer(
        hidden_states=hidden,
        encoder_hidden_states=call.text,
        encoder_hidden_states_mask=torch.ones(call.text.shape[:2], dtype=torch.bool),
        timestep=model.schedule.model_time(sigma),
        img_shapes=[[SIZE]] * hidden.shape[0],
        return_dict=False,
    )[0]
    unmasked = model.transformer(
        hidden_states=hidden,
        encoder_hidden_states=call.text,
        timestep=model.schedule.model_time(sigma),
        img_shapes=[[SIZE]] * hidden.shape[0],
        return_dict=False,
    )[0]
    diff = (masked - unmasked).abs().max().item()
    assert diff <= ATOL, diff
    # and our guided velocity from the unmasked call equals the one from the masked outputs
    n = x.shape[0]
    cond, neg = masked[:n][k], masked[n:]
    guided = neg + 4.0 * (cond - neg)
    guided = guided * (cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))
    ref = masked[:n].clone()
    ref[k] = guided
    diff = (ours - ref).abs().max().item()
    assert diff <= ATOL, diff


@torch.inference_mode()
def test_split_calls_equal_one_masked_call(model: QwenImageModel) -> None:
    lengths = [(13, 5), (8, None), (13, 5), (21, 8)]
    conds = _conds(model, lengths, 3)
    x, t = _state(4, 4)
    split = _with_cost(model, ALWAYS_SPLIT)
    whole = _with_cost(model, NEVER_SPLIT)
    sb, wb = split.collate(conds, torch.zeros(4)), whole.collate(conds, torch.zeros(4))
    assert len(wb.calls) == 1 and wb.calls[0].mask is not None
    assert len(sb.calls) == 4 and all(c.mask is None for c in sb.calls)  # lengths 5, 8, 13, 21
    diff = (split.velocity(sb, x, t) - whole.velocity(wb, x, t)).abs().max().item()
    assert diff <= ATOL, diff
