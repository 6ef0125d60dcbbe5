"""benchmarks.omni_gpu on the CPU at tiny sizes (`--smoke`): the stage timelines' account of
one request (`critical_path`) against what the pipeline actually did, every level warmed up
before it is measured, and a phase that fails reported with the reason its stage gave. Real
stage processes, real engines, real sockets."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common.timelines import stage_timeline
from benchmarks.common.warmup import order_problems

REPO = Path(__file__).resolve().parent.parent


def _bench(tmp_path: Path, models: Path, *extra: str, concurrency: str = "1") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "benchmarks.omni_gpu", "--smoke", "--phases", "stream", "--concurrency", concurrency]
    cmd += [*extra, "--out", str(tmp_path), "--work-dir", str(models)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmark's --work-dir: the checkpoints its first run builds, the next one reuses."""
    return tmp_path_factory.mktemp("omni_gpu-models")


@pytest.fixture(scope="module")
def levels_1_and_3(tmp_path_factory: pytest.TempPathFactory, models: Path) -> Path:
    """One stream phase at levels 1 and 3 (the tests below read its --out): requests of 8
    thinker tokens and 36 codes, streamed in two chunks (12 codes, then the rest)."""
    tmp_path = tmp_path_factory.mktemp("omni_gpu")
    run = _bench(
        tmp_path,
        models,
        *("--token2wav-first-chunk", "12", "--talker-priority", "below_normal"),
        *("--torch-profile", "1:30:12"),  # the talker's steps 30..41: in level 1's warm-up round or the next
        concurrency="1,3",
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return tmp_path


def test_one_request_path_through_the_stages(levels_1_and_3: Path) -> None:
    """One request of 8 thinker tokens and 36 codes, streamed in two chunks (12 codes, then the
    rest): the timelines place each stage's part in the order the pipeline's data flow forces;
    then three at once (`burst_path`), in the same order."""
    tmp_path = levels_1_and_3
    stream = json.loads((tmp_path / "stream.json").read_text())
    assert stream["1"]["audio_s_per_request"] == 36 * 480 / 24000  # the fixed lengths held
    # the audio came in chunks, its first before the request's end (not all of it with Finished)
    assert stream["1"]["streamed_requests"] == stream["1"]["requests"] == 1
    assert stream["3"]["streamed_requests"] == stream["3"]["requests"] == 3
    cp = stream["critical_path_c1"]
    assert "error" not in cp, cp
    # one token a step at one request (a last step may carry only the final hidden rows)
    assert cp["thinker_steps"] in (8, 9)
    assert cp["talker_first_chunk_codes"] == 24  # the first chunk and its 12 codes of right context
    assert 0 < cp["thinker_first_token_ms"] <= cp["thinker_last_token_ms"]
    # the talker starts from the thinker's rows; token2wav from the talker's codes
    assert cp["thinker_first_token_ms"] <= cp["talker_first_code_ms"] <= cp["talker_first_chunk_ms"]
    assert cp["talker_first_chunk_ms"] < cp["talker_last_code_ms"]
    assert cp["talker_first_chunk_ms"] <= cp["t2w_first_out_ms"] < cp["t2w_last_out_ms"]
    assert cp["talker_last_code_ms"] <= cp["t2w_last_out_ms"]
    # the first chunk took solver steps; the last chunk was solved after the last code came
    assert cp["t2w_first_chunk_steps"] >= 1 and cp["t2w_first_chunk_step_ms_sum"] > 0
    assert cp["t2w_tail_steps"] >= 1 and cp["t2w_tail_step_ms_sum"] > 0
    # three requests at once: every thinker token, then the talker over all, then the codes of
    # the first chunk, then half of them with audio
    bp = stream["burst_paths"]["3"]
    assert "error" not in bp, bp
    assert 1 <= bp["talker_widest_step"] <= 3
    assert 0 < bp["thinker_first_step_ms"] <= bp["thinker_all_first_token_ms"] <= bp["talker_first_step_all_ms"]
    assert bp["talker_first_step_all_ms"] < bp["talker_first_chunk_ms"] <= bp["t2w_half_out_ms"]
    assert bp["t2w_steps"] >= 1 and bp["talker_handle_before_ms"] > 0
    md = (tmp_path / "omni_gpu.md").read_text()
    assert "one request's path through the stages" in md
    assert "- c=3: thinker first step ends" in md
    assert "(thinker: normal, talker: below_normal)" in md  # the priorities asked for are named
    # the talker's profile window: its report, with our loop's and vLLM's runner scopes, and its trace
    report = (tmp_path / "profile-stream" / "torch-stage1-30.txt").read_text()
    assert report.startswith("stage 1, engine steps 30..41\n"), report[:200]
    for scope in ("omni: engine step", "omni: step outputs", "gpu_model_runner: forward"):
        assert scope in report, scope
    with gzip.open(tmp_path / "profile-stream" / "torch-stage1-30.trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    steps = [e for e in events if e.get("name") == "omni: engine step"]
    assert len(steps) == 12  # the window's steps, no more
    assert not list((tmp_path / "profile-stream").glob("torch-stage0-*"))  # only the stage named


def test_every_level_is_warmed_up_before_it_is_measured(levels_1_and_3: Path) -> None:
    """Level by level, in order: an unmeasured round of that level's requests, then its measured
    round. The warm-up ran the level's shapes (the thinker's widest step in it holds every one
    of the level's requests), and the report and the JSON say how each level was warmed."""
    out = levels_1_and_3
    warmup = json.loads((out / "stream.json").read_text())["warmup"]
    assert order_problems(warmup) == []
    levels = warmup["levels"]
    assert list(levels) == ["1", "3"]
    thinker = stage_timeline(out / "profile-stream", 0)
    assert isinstance(thinker, list), thinker
    before = 0.0  # the previous level's measured round ended
    for c, level in levels.items():
        (w0, w1), (m0, m1) = level["window"], level["measured"]
        assert level["requests"] == int(c)
        assert before <= w0 < w1 <= m0 < m1, level
        assert max(r["reqs"] for r in thinker if w0 <= r["t"] <= w1) == int(c)
        before = m1
    md = (out / "omni_gpu.md").read_text()
    assert "warm-up (stream): one unmeasured round at each level's concurrency" in md
    assert "(1: 1 request, " in md and "; 3: 3 requests, " in md and "NOT WARMED FIRST" not in md
    assert json.loads((out / "omni_gpu.json").read_text())["results"]["stream"]["warmup"] == warmup


def test_a_failed_phase_is_reported_with_its_stage_error(tmp_path: Path, models: Path) -> None:
    """A first chunk token2wav cannot take (not a multiple of its 12-code attention block): the
    stage exits at start-up, and the report names the reason, not only an exit code."""
    run = _bench(tmp_path, models, "--token2wav-first-chunk", "7")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]  # failed, and the report still written
    error = json.loads((tmp_path / "stream.json").read_text())["error"]
    assert error.startswith("exit code 1: StartupError: stage 2 exited"), error
    assert "streaming.first_chunk: must be a multiple of the model's block alignment (12 ids)" in error, error
    md = (tmp_path / "omni_gpu.md").read_text()
    assert "phase stream failed: exit code 1: StartupError" in md


def test_token2wav_budget_has_a_floor_taken_from_its_neighbours() -> None:
    """On a GPU whose share for token2wav is below T2W_MIN_GIB (an H100's 12%: 9.6 GiB, which
    ran out of memory at 64 requests) token2wav gets the floor, the stages beside it give it up
    in their shares' ratio, and the device's budgeted total stays the same; where the share is
    enough (an H200) the split is the shares."""
    from benchmarks.omni_gpu import SHARES, T2W_MIN_GIB, split_budgets

    for gpus in (1, 2):
        shares = SHARES[gpus]
        for total in (79.2, 140.5):
            split = split_budgets(total, gpus)
            assert split[2] >= T2W_MIN_GIB
            if shares[2] * total >= T2W_MIN_GIB:  # the shares as they are
                assert split == [round(f * total, 1) for f in shares]
                continue
            assert split[2] == T2W_MIN_GIB
            on_its_gpu = (0, 1, 2) if gpus == 1 else (1, 2)  # with --gpus 2 the thinker has GPU 0
            assert abs(sum(split[i] for i in on_its_gpu) - sum(shares[i] for i in on_its_gpu) * total) < 0.15
            if gpus == 1:
                assert abs(split[0] / split[1] - shares[0] / shares[1]) < 1e-2
            else:
                assert split[0] == round(shares[0] * total, 1)
