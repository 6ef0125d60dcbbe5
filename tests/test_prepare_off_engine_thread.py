"""An entry stage prepares requests (media checks, the prompt format, vLLM's input processing:
the audio feature extractor and the image processor) beside its engine thread, so one
request's heavy media do not hold up the steps of the requests already running.

Measured where it matters: the stage's own step timeline (`OMNI_MP_PROFILE_DIR`). The gap
between the end of one engine step and the start of the next is the engine thread's time
outside the engine; a preparation on that thread would show up there as one gap as long as
the preparation itself. A real launcher, the tiny Qwen2.5-Omni thinker alone on CPU."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from omni_mp.client.omni_client import OmniClient
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.launcher import serve, settled_client
from tests.synthetic_media import tone

pytestmark = pytest.mark.engine

CONFIG = """
name: tiny_thinker_alone
stages:
  - id: 0
    model: tiny-qwen2_5-omni
    prompt_format: qwen2_5_omni
    final_output: true
    engine_args:
      dtype: float32
      enforce_eager: true
      max_model_len: 4096
      max_num_seqs: 4
      seed: 0
      limit_mm_per_prompt: {audio: 1, image: 1, video: 0}
    sampling:
      max_tokens: 8
"""


def step_gaps(timeline: dict, t0: float, t1: float) -> list[float]:
    """Seconds between one step's end and the next step's start, for steps inside [t0, t1]."""
    rows = [dict(zip(timeline["fields"], r, strict=True)) for r in timeline["steps"]]
    rows = [r for r in rows if t0 <= r["t"] <= t1]
    return [b["t"] - (a["t"] + a["step_ms"] / 1000) for a, b in zip(rows, rows[1:], strict=False)]


def test_heavy_media_are_prepared_without_stalling_running_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = tmp_path / "profile"
    monkeypatch.setenv("OMNI_MP_PROFILE_DIR", str(profile))
    config = tmp_path / "thinker.yaml"
    config.write_text(CONFIG)
    audio = torch.from_numpy(tone(30.0))  # 30 s at 16 kHz
    image = torch.randint(0, 256, (2048, 2048, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    heavy: dict[str, object] = {}
    with serve(config) as pipeline, settled_client(pipeline.endpoint) as client:
        assert isinstance(client, OmniClient)

        def submit_heavy() -> None:
            heavy["t_submit"] = time.time()
            try:
                heavy["done"] = client.generate(
                    "What do you hear and see?", audios=[(audio, 16_000)], images=[image], deadline_s=600
                )
            except Exception as e:  # noqa: BLE001 - reported by the test below, not lost in the thread
                heavy["done"] = e

        # The bystander decodes until the heavy request is done (closing its stream aborts it): a
        # fixed length would race the heavy request's submission on a slow host.
        running = {0: SamplingParamsMsg(max_tokens=4000, ignore_eos=True)}
        chunks = 0
        worker = None
        t_end = float("inf")  # the bystander's end, if it ends on its own
        bystander = client.stream("Tell me a long story.", sampling=running, deadline_s=600)
        for ev in bystander:
            if isinstance(ev, StageOutputChunk) and ev.token_ids:
                chunks += 1
                if chunks == 20:  # the bystander is decoding: now the heavy request comes in
                    worker = threading.Thread(target=submit_heavy)
                    worker.start()
                elif worker is not None and not worker.is_alive():
                    break
            elif isinstance(ev, Finished):
                t_end = ev.t_finished
        bystander.close()
        assert worker is not None
        worker.join(600)
    done = heavy["done"]
    assert isinstance(done, Finished) and done.outputs[0].token_ids, done
    timing = done.stage_timings[0]
    prepare_s = timing.t_started - timing.t_registered  # registration -> handed to the engine
    assert timing.num_prompt_tokens > 1000  # 30 s of audio and a 2048x2048 image did go in
    (path,) = profile.glob("stage0-*.json")
    assert t_end > timing.t_started, "the bystander ended before the heavy request reached the engine"
    gaps = step_gaps(json.loads(path.read_text()), timing.t_registered, timing.t_started)
    assert len(gaps) >= 3, "no engine step while the heavy request was prepared"
    print(
        f"\n[prepare] heavy request prepared in {prepare_s * 1000:.0f} ms; {len(gaps)} bystander steps meanwhile, "
        f"step gaps max {max(gaps) * 1000:.1f} ms, median {sorted(gaps)[len(gaps) // 2] * 1000:.1f} ms"
    )
    # The preparation is long enough to be seen if it ran on the engine thread ...
    assert prepare_s > 0.1
    # ... and the engine kept stepping the running request meanwhile, with no gap near it.
    assert max(gaps) < prepare_s / 4, f"an engine-thread gap of {max(gaps):.3f}s during a {prepare_s:.3f}s preparation"
