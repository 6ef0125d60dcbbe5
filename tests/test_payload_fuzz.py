"""Mutation fuzzing of the decoder: nothing but PayloadError may escape, whatever the bytes."""

from __future__ import annotations

import functools
import random
import time

import numpy as np
import torch

from omni_mp.wire.codec import Limits, PayloadError, decode, encode
from omni_mp.wire.messages import (
    Abort,
    HiddenRows,
    LayerRows,
    MRopePositions,
    PromptEmbeds,
    SamplingParamsMsg,
    StageOutputBatch,
    StageOutputChunk,
    StageRequest,
)
from omni_mp.wire.shm_pool import ShmPool, ShmPoolConfig, ShmReader, ShmRef

ITERATIONS = 10_000
# Small limits make mutated sizes hit them often, not only the frame-length checks.
LIMITS = Limits(max_tensor_bytes=1 << 16, max_message_bytes=1 << 18, max_body_bytes=1 << 12, max_list_length=64)


def seed_messages() -> list[object]:
    g = torch.Generator().manual_seed(0)
    return [
        StageRequest(
            request_id="req-1",
            stage_id=1,
            prompt_token_ids=[1, 2, 3],
            prompt_embeds=PromptEmbeds(torch.randn(3, 16, generator=g).to(torch.bfloat16)),
            additional_information={
                "hidden": torch.randn(2, 8, generator=g),
                "mask": torch.tensor([True, False, True]),
                "ids": torch.arange(5, dtype=torch.int32),
                "empty": torch.empty(0, 4, dtype=torch.float16),
                "scalar": torch.tensor(7, dtype=torch.int64),
                "bytes": torch.arange(9, dtype=torch.uint8),
                "speaker": "Chelsie",
                "n": 3,
                "tokens": [4, 5],
            },
            sampling_params=SamplingParamsMsg(temperature=0.8, stop_token_ids=[2]),
            deadline_s=1.0,
        ),
        StageOutputChunk(request_id="r", stage_id=0, token_ids=[9, 8], additional_information={"x": torch.ones(4)}),
        Abort(request_id="r", reason="x"),
        step_batch(g),
    ]


def step_batch(g: torch.Generator) -> StageOutputBatch:
    """A packed step: column chunks with rows, one without, and a first chunk that stays a chunk."""

    def rows(start: int, n: int) -> HiddenRows:
        return HiddenRows(start=start, last=torch.randn(n, 4, generator=g), layers=[LayerRows(2, torch.randn(n, 4))])

    first = StageOutputChunk(request_id="a", stage_id=1, prompt_token_ids=[1, 2], hidden=rows(0, 2))
    first.hidden.mrope = MRopePositions(torch.zeros(3, 2, dtype=torch.int64), 0)
    return StageOutputBatch.pack(
        [
            StageOutputChunk(request_id="b", stage_id=1, token_ids=[5], hidden=rows(7, 1)),
            first,
            StageOutputChunk(request_id="c", stage_id=1, token_ids=[6, 7]),
            StageOutputChunk(request_id="d", stage_id=1, token_ids=[8], hidden=rows(3, 2)),
        ]
    )


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(8)
        i = rng.randrange(len(frames)) if frames else 0
        if not frames:
            frames.append(rng.randbytes(rng.randint(0, 16)))
        elif op <= 2:  # flip bytes, mostly in the body where the structure is
            j = 0 if op < 2 else i
            b = bytearray(frames[j])
            for _ in range(rng.randint(1, 4)):
                if b:
                    b[rng.randrange(len(b))] = rng.randrange(256)
            frames[j] = bytes(b)
        elif op == 3:  # truncate
            frames[i] = frames[i][: rng.randint(0, len(frames[i]))]
        elif op == 4:  # drop a frame
            del frames[i]
        elif op == 5:  # duplicate a frame
            frames.insert(rng.randrange(len(frames) + 1), frames[i])
        elif op == 6:  # swap two frames
            k = rng.randrange(len(frames))
            frames[i], frames[k] = frames[k], frames[i]
        else:  # extend with junk
            frames[i] = frames[i] + rng.randbytes(rng.randint(1, 8))
    return frames


def test_mutated_frames_only_raise_payload_error() -> None:
    rng = random.Random(1234)
    bases = [[bytes(memoryview(f).cast("B")) for f in encode(m, LIMITS)] for m in seed_messages()]
    outcomes = {"ok": 0, "rejected": 0}
    start = time.monotonic()
    for _ in range(ITERATIONS):
        frames = mutate(rng, rng.choice(bases))
        try:
            msg = decode(frames, LIMITS)
            if isinstance(msg, StageOutputBatch):  # what a receiver does next: columns and ranges checked
                msg.unpacked()
            outcomes["ok"] += 1
        except PayloadError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > ITERATIONS // 2, outcomes  # the mutations do bite
    assert time.monotonic() - start < 20


def place(pool: ShmPool, placed: list[ShmRef], data: np.ndarray) -> ShmRef | None:
    """A BufferPlacer that remembers what it put in the pool."""
    if not pool.accepts(data.size):
        return None
    placed.append(pool.put(data))
    return placed[-1]


def test_mutated_shared_memory_descriptors_only_raise_payload_error() -> None:
    """Same, for messages whose tensors sit in a (local) pool: forged pool names, pids, fds,
    slots, generations and offsets must all be refused."""
    rng = random.Random(99)
    with ShmPool(ShmPoolConfig(capacity_bytes=1 << 20, num_slots=64, threshold_bytes=1)) as pool:
        reader = ShmReader()
        for _ in range(300):
            placed: list[ShmRef] = []
            frames = encode(seed_messages()[rng.randrange(2)], LIMITS, place=functools.partial(place, pool, placed))
            frames = [bytes(memoryview(f).cast("B")) for f in frames]
            try:
                decode(mutate(rng, frames), LIMITS, shm=reader)
            except PayloadError:
                pass
            for ref in placed:  # a mutation may have dropped a descriptor: take it back
                pool.free(ref)
            assert pool.wait_drained(1.0)
        reader.close()
