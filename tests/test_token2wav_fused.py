"""token2wav's fused forms (`token2wav_fused.py`, `model_options: compile_dit / compile_vocoder`)
against transformers' own modules (CPU, tiny token2wav, random weights):

- the polyphase anti-aliased SnakeBeta, run eagerly, against every distinct
  `Qwen2_5OmniAntiAliasedActivation1d` of the vocoder, at lengths down to one frame (where
  replicate padding reaches across the whole input);
- the DiT block with every block's modulation from one matmul and masks built once per call,
  against `DiTDecoderLayer.forward` (1e-6 relative: the fused matmul may sum in another
  order);
- the whole model compiled with inductor against transformers' DiT forward (+ CFG) and BigVGAN
  forward. Measured: velocity 2.8e-7 - 3.4e-7, waveform 1.6e-7 relative L2 (bound 1e-5, the
  fp32 bound of the other token2wav tests);
- compiling once serves other batch and frame sizes (dynamic shapes): no graph is compiled
  for a new bucket, so the stage's start-up compile is the only one.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from omni_mp.engines.diffusion.model import Window
from omni_mp.engines.diffusion.params import DiffusionParams
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav
from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel
from omni_mp.models.qwen2_5_omni.token2wav_fused import (
    AntialiasedSnake,
    block_masks,
    dit_block,
    final_norm,
    modulations,
)
from tests.test_token2wav_precision import GUIDANCE, one_request, rel, transformers_velocity

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def t2w_dir() -> str:
    return str(build_token2wav(TOKEN2WAV_SPECS["tiny-token2wav"]))


@pytest.fixture(scope="module")
def eager(t2w_dir: str) -> Token2WavModel:
    return Token2WavModel.from_checkpoint(t2w_dir, CPU)


@pytest.fixture(scope="module")
def compiled(t2w_dir: str) -> Token2WavModel:
    return Token2WavModel.from_checkpoint(t2w_dir, CPU, compile_dit=True, compile_vocoder=True)


@torch.no_grad()
def distinct_activations(vocoder: torch.nn.Module, g: torch.Generator) -> list[torch.nn.Module]:
    """One anti-aliased activation per width of a copy of `vocoder`, the last one included,
    with random SnakeBeta parameters (their init is 0)."""
    vocoder = copy.deepcopy(vocoder)
    acts = [block.activations[0] for block in vocoder.resblocks[:: vocoder.num_residual_blocks]]
    acts.append(vocoder.activation_post)
    for act in acts:
        act.act.alpha.copy_(torch.randn(act.act.alpha.shape, generator=g) * 0.5)
        act.act.beta.copy_(torch.randn(act.act.beta.shape, generator=g) * 0.5)
    return acts


@torch.no_grad()
def test_polyphase_snake_is_transformers_activation(eager: Token2WavModel) -> None:
    g = torch.Generator().manual_seed(3)
    for act in distinct_activations(eager.vocoder, g):
        fused = AntialiasedSnake(act)
        for frames in (1, 2, 5, 37, 168):
            x = torch.randn(2, act.act.in_features, frames, generator=g) * 3
            want = act(x)
            got = fused(x)
            assert got.shape == want.shape
            assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (act.act.in_features, frames)


@torch.no_grad()
def test_dit_block_with_one_modulation_matmul_is_transformers_layer(eager: Token2WavModel) -> None:
    """Blocks whose modulations come from one matmul, with masks built once per call and RoPE's
    cos / sin built once per batch, against `DiTDecoderLayer.forward` on the same (shared)
    weights; and the final norm against `Qwen2_5_OmniAdaLayerNormZero_Final`."""
    dit, fused = eager.dit, eager._modulation
    window = Window("a", torch.arange(30) % (eager.num_codes - 1), 0, DiffusionParams(seed=1, speaker="Chelsie"))
    short = Window("b", torch.arange(18), 0, DiffusionParams(seed=2, speaker="Chelsie"))
    batch = eager.collate([eager.condition(window), eager.condition(short)], torch.tensor([GUIDANCE, GUIDANCE]))
    rows, s = batch.code_embed.shape[:2]
    g = torch.Generator().manual_seed(5)
    h = torch.randn(rows, s, dit.config.hidden_size, generator=g)
    temb = dit.time_embed(torch.rand(rows, generator=g))
    cos, sin = dit.rotary_embed(h, torch.arange(s)[None].expand(rows, s))  # transformers': per row
    assert torch.equal(batch.cos.expand(rows, -1, -1), cos) and torch.equal(batch.sin.expand(rows, -1, -1), sin)
    masks = block_masks(batch.block_diff, dit.transformer_blocks)
    assert len({id(m) for m in masks}) == len(
        {(x.look_backward_block, x.look_ahead_block) for x in dit.transformer_blocks}
    )
    mods, final_mod = modulations(fused, temb)
    assert len(mods) == len(dit.transformer_blocks)
    rows_per_block = 6 * dit.config.hidden_size
    for i, (layer, mod, mask) in enumerate(zip(dit.transformer_blocks, mods, masks, strict=True)):
        # the module's weight is a view of the fused matrix: the weights are held once
        assert layer.attn_norm.linear.weight.data_ptr() == fused.weight[i * rows_per_block :].data_ptr()
        want = layer(h, temb, position_embeddings=(cos, sin), block_diff=batch.block_diff)
        got = dit_block(layer, h, mod, batch.cos, batch.sin, mask)
        assert rel(got, want) <= 1e-6, rel(got, want)
    assert rel(final_norm(dit.norm_out, h, final_mod), dit.norm_out(h, temb)) <= 1e-6


def test_compiled_token2wav_is_transformers(t2w_dir: str, eager: Token2WavModel, compiled: Token2WavModel) -> None:
    codes, x, t, window = one_request(eager)
    batch = compiled.collate([compiled.condition(window)], torch.tensor([GUIDANCE]))
    got = compiled.velocity(batch, x, t)[0]
    want = transformers_velocity(copy.deepcopy(eager.dit), t2w_dir, codes, x, t, bf16=False)
    assert rel(got, want) <= 1e-5
    assert rel(got, eager.velocity(batch, x, t)[0]) <= 1e-5

    mel = torch.randn(2, eager.state_dim, 40, generator=torch.Generator().manual_seed(2)) - 4.0
    with torch.no_grad():
        wav = copy.deepcopy(eager.vocoder)(mel)  # transformers' BigVGAN forward
    assert wav.abs().max() > 1e-3  # the tiny vocoder is not silent (its weights were reset)
    assert rel(compiled._vocode(mel), wav) <= 1e-5


def test_start_up_compile_serves_every_size(compiled: Token2WavModel) -> None:
    """What a stage without CUDA graphs compiles at start-up (`warm_up_compiled`) serves every
    later batch and frame size, padded to a graph bucket or not: no request's step compiles."""
    torch._dynamo.reset()  # forget what earlier tests compiled
    params = DiffusionParams(seed=1, speaker="Chelsie", guidance_scale=GUIDANCE)
    compiled.warm_up_compiled(params)
    before = counters["stats"]["unique_graphs"]
    g = torch.Generator().manual_seed(7)

    def step(b: int, n: int, pad: bool) -> None:
        wins = [Window(f"r{i}", torch.randint(0, 100, (n - 6 * i,), generator=g), 0, params) for i in range(b)]
        frames = n * compiled.frames_per_input
        conds = [compiled.condition(w) for w in wins]
        batch = compiled.collate(conds, torch.full((b,), GUIDANCE), pad_to=(b, frames) if pad else None)
        compiled.velocity(batch, torch.randn(b, frames, compiled.state_dim, generator=g), torch.rand(b, generator=g))
        compiled._vocode(torch.randn(b, compiled.state_dim, frames, generator=g) - 4.0)

    for b, n, pad in ((3, 48, True), (8, 84, True), (1, 36, False), (2, 60, False), (1, 24, True)):
        step(b, n, pad)
    assert before > 0 and counters["stats"]["unique_graphs"] == before
