"""How one step's text rows of one image size are split into transformer calls.

A call whose rows all have the same text length needs no key-padding mask, and without a mask
PyTorch SDPA runs its flash kernel; with a mask it falls back to the memory-efficient (or math)
kernel. A call over rows of different lengths must pad and mask them. So a step chooses, over
its rows sorted by text length, contiguous runs of lengths: a run of one length is an
unmasked call, a run of several lengths a masked call padded to its longest.

The choice minimises an estimated cost per call, in units of "one token through the
transformer's linear layers" (weights are shared by every row of a call):

    cost = max(LAUNCH, rows * T * (1 + T / ATTN_TOKENS * (MASK_PENALTY if masked else 1)))

with T = image tokens + padded text length. Where the constants come from (H200, bf16, the
20B DiT, eager PyTorch; benchmarks/image_gpu.py):
- ATTN_TOKENS: the per-row sequence length at which flash attention costs as much as the
  linear layers: attention is 4 T^2 d FLOPs per block against ~226 MFLOP per token per block
  (d = 3072, MLP 4x), at roughly half the throughput of the GEMMs -> T ~ 10k;
- MASK_PENALTY: the memory-efficient kernel against flash on Hopper; 2.3 reproduces the
  measured 481.7 ms (one masked call of 2 rows at 1024x1024) against 347.5 ms (two unmasked
  calls);
- LAUNCH: an eager call of the 60-block DiT is bound by kernel launches below ~4000 tokens
  of work (512x512, ~1000 tokens a row: 130 ms a call, barely less than a 2-row call).

These were measured with SDPA's cuDNN kernel off (as vLLM leaves it). The stage now turns it
on (`diffusion.cudnn_attention`), and cuDNN's kernel takes masks without that penalty (H100,
512x512: the masked CFG pair's attention 10.8 ms a step with it, 17.0 ms without), so the model
over-prices masked calls: at 1024x1024 it still splits the CFG pair, which costs what one call
would there (compute-bound); at 512x512 it merges anyway. Left as measured.

Consequences: rows of equal length always share one unmasked call; at 512x512 a CFG pair
(prompt and " ") shares one masked call (launch-bound: splitting would double the launches);
at 1024x1024 it runs as two unmasked calls (attention-bound). Many requests of one size
merge into a few calls, never one per row, while a call is still launch-bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec


class CallCost(msgspec.Struct, frozen=True):
    """The cost model's constants (see the module doc)."""

    launch: float = 4000.0
    attn_tokens: float = 10000.0
    mask_penalty: float = 2.3

    def of(self, rows: int, tokens: int, masked: bool) -> float:
        attn = tokens / self.attn_tokens * (self.mask_penalty if masked else 1.0)
        return max(self.launch, rows * tokens * (1.0 + attn))


GPU_COST = CallCost()


def plan_calls(lengths: Sequence[int], image_tokens: int, cost: CallCost = GPU_COST) -> list[list[int]]:
    """Row indices (into `lengths`) of each transformer call; a call needs a mask iff its rows'
    lengths differ. Calls are contiguous runs of distinct lengths in ascending order, chosen by
    dynamic programming over the run boundaries."""
    if not lengths:
        return []
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    distinct = sorted(by_len)
    if len(distinct) == 1:
        return [list(range(len(lengths)))]
    counts = [len(by_len[n]) for n in distinct]
    k = len(distinct)
    best = [0.0] + [float("inf")] * k  # best[j]: cost of the first j distinct lengths
    cut = [0] * (k + 1)
    for j in range(1, k + 1):
        rows = 0
        for i in range(j - 1, -1, -1):  # the last call covers distinct[i:j]
            rows += counts[i]
            c = best[i] + cost.of(rows, image_tokens + distinct[j - 1], masked=j - i > 1)
            if c < best[j]:
                best[j], cut[j] = c, i
    calls: list[list[int]] = []
    j = k
    while j > 0:
        i = cut[j]
        calls.append(sorted(r for n in distinct[i:j] for r in by_len[n]))
        j = i
    return calls[::-1]
