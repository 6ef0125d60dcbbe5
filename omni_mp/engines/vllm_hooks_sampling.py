"""Suppressed token ids as a vLLM 0.25.0 logits processor (`vllm.v1.sample.logits_processor`),
for the stages whose runner is vLLM's V1 runner anyway (the hooked ones: see `ar.py`).

Why not vLLM's `allowed_token_ids`: a request that may sample every id but a few (a talker
that must never write its codec control ids) has to list all the others, and vLLM pays for
that list per request on the stage's engine thread: `SamplingParams.clone()` deep-copies it
(3.9 ms for 8,192 ids) and the runner writes it into the request's mask row by indexing with
the Python list (5.9 ms), measured on this project's CPU host. A burst of 32 talker requests
then spent about 200 ms of host time before the talker's first step (`benchmarks/omni_gpu.py
--smoke --concurrency 32`); on an H200 (Qwen2.5-Omni, released sizes) the talker's engine
thread handled input for 451 ms before its first step over 32 requests, 57 ms with this
processor. Here a request names only the ids it suppresses (`SamplingParams.extra_args`), and
each distinct set becomes one device row, built once and copied into the batch's mask.

Exactness: the suppressed logits are set to -inf before penalties and temperature, where
vLLM applies `allowed_token_ids` (the sampler runs non-argmax-invariant processors right
after that mask), so greedy and sampled results are those of the allowed-ids mask.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

if TYPE_CHECKING:
    from vllm.config import VllmConfig

SUPPRESS_KEY = "omni_mp_suppress_token_ids"  # SamplingParams.extra_args key: sorted unique ids
MAX_CACHED_SETS = 64  # distinct suppressed sets kept as device rows (a stage has one or two)


def suppress_args(token_ids: Iterable[int]) -> dict[str, Any]:
    """The `extra_args` that make `SuppressTokens` mask these ids for one request."""
    return {SUPPRESS_KEY: tuple(sorted(set(token_ids)))}


class SuppressTokens(LogitsProcessor):
    """Sets the logits of each request's suppressed ids to -inf. The mask is a device tensor
    [max_num_seqs, vocab]; batch changes update only the rows they touch, with a few kernels
    whatever their number, and nothing waits for the device."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        ids = (sampling_params.extra_args or {}).get(SUPPRESS_KEY)
        if ids is not None and not (isinstance(ids, tuple | list) and all(isinstance(t, int) and t >= 0 for t in ids)):
            raise ValueError(f"{SUPPRESS_KEY}: expected a sequence of token ids, got {ids!r}")

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.pin = is_pin_memory
        self.vocab = vllm_config.model_config.get_vocab_size()
        self.max_rows = vllm_config.scheduler_config.max_num_seqs
        self.rows: dict[int, tuple[int, ...]] = {}  # batch index -> its suppressed ids
        self.sets: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()  # ids -> device row [vocab]
        self.mask: torch.Tensor | None = None  # [max_rows, vocab] bool, allocated at first use
        self.zero_row: torch.Tensor | None = None

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which id is the greedy choice

    def _set_row(self, ids: tuple[int, ...]) -> torch.Tensor:
        row = self.sets.get(ids)
        if row is not None:
            self.sets.move_to_end(ids)
            return row
        host = torch.zeros(self.vocab, dtype=torch.bool, pin_memory=self.pin)
        # The AR engine refuses ids outside the vocabulary before a request gets here; one that
        # came some other way masks nothing rather than failing the whole batch's step.
        host[torch.tensor([t for t in ids if t < self.vocab], dtype=torch.long)] = True
        row = host.to(self.device, non_blocking=True)
        self.sets[ids] = row
        if len(self.sets) > MAX_CACHED_SETS:
            self.sets.popitem(last=False)
        return row

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        changed: set[int] = set()
        for index in batch_update.removed:
            if self.rows.pop(index, None) is not None:
                changed.add(index)
        for index, params, _, _ in batch_update.added:
            ids = (params.extra_args or {}).get(SUPPRESS_KEY) if params is not None else None
            old = self.rows.pop(index, None)
            if ids:
                self.rows[index] = tuple(ids)
            if ids or old is not None:
                changed.add(index)
        for a, b, direction in batch_update.moved:
            ids_a, ids_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if ids_a is not None:
                self.rows[b] = ids_a
            if direction == MoveDirectionality.SWAP and ids_b is not None:
                self.rows[a] = ids_b
            if ids_a is not None or ids_b is not None:
                changed.update((a, b))
        if changed:
            self._write(sorted(changed))

    def _write(self, indices: list[int]) -> None:
        """Rewrite these mask rows from `rows` in three kernels: stack, index copy (and the
        index's host-to-device copy)."""
        if self.mask is None:
            self.mask = torch.zeros(self.max_rows, self.vocab, dtype=torch.bool, device=self.device)
            self.zero_row = torch.zeros(self.vocab, dtype=torch.bool, device=self.device)
        assert self.zero_row is not None
        src = torch.stack([self._set_row(self.rows[i]) if i in self.rows else self.zero_row for i in indices])
        index = torch.tensor(indices, dtype=torch.long, pin_memory=self.pin).to(self.device, non_blocking=True)
        self.mask.index_copy_(0, index, src)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.rows:
            assert self.mask is not None
            logits.masked_fill_(self.mask[: logits.shape[0]], float("-inf"))
        return logits
