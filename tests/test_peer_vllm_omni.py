"""The side-by-side benchmark's shared model dir (benchmarks.common.omni_bench_dir) and the vllm-omni
driver (benchmarks.peer_vllm_omni) on this CPU host.

vllm-omni itself is never installed in the project's environment; the tests that run it need it
in a directory of its own, named by PEER_SITE (e.g. `pip install --no-deps --target
/tmp/peer-site vllm_omni==0.25.0rc1` + benchmarks/peer/wheels.txt), and skip without it.
vllm-omni 0.25.0rc1 has no CPU platform: here its run fails at its first stage, and what is
checked is that the driver writes that failure, with its error, into the result file and that
benchmarks.omni_gpu's report shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PEER_SITE = Path(os.environ.get("PEER_SITE", "/tmp/peer-site"))
needs_peer = pytest.mark.skipif(
    not (PEER_SITE / "vllm_omni").is_dir(), reason=f"vllm-omni not installed in PEER_SITE={PEER_SITE}"
)


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from benchmarks.common.omni_bench_dir import with_processor
    from omni_mp.models.qwen2_5_omni.shapes import OmniShapesSpec, build_omni_shapes

    shapes = build_omni_shapes(OmniShapesSpec(scale=28), cache_dir=tmp_path_factory.mktemp("models"))
    return shapes, with_processor(shapes)


def test_bench_dir_is_the_shapes_dir_plus_a_released_layout_tokenizer(bench_dir: tuple[Path, Path]) -> None:
    from transformers import AutoProcessor, AutoTokenizer

    shapes, bench = bench_dir
    for f in shapes.iterdir():  # the same checkpoint for every system
        assert (bench / f.name).read_bytes() == f.read_bytes(), f.name
    cfg = json.loads((bench / "config.json").read_text())
    thinker = cfg["thinker_config"]
    tok = AutoTokenizer.from_pretrained(bench)
    assert len(tok) == 151665 < thinker["text_config"]["vocab_size"]  # the released tokenizer's size
    named = {
        "audio_token_index": "<|AUDIO|>",
        "image_token_index": "<|IMAGE|>",
        "video_token_index": "<|VIDEO|>",
        "vision_start_token_id": "<|vision_bos|>",
        "vision_end_token_id": "<|vision_eos|>",
        "audio_start_token_id": "<|audio_bos|>",
        "audio_end_token_id": "<|audio_eos|>",
    }
    for key, token in named.items():  # config ids name the tokens they name in the released checkpoint
        assert tok.convert_tokens_to_ids(token) == thinker[key], key
    assert tok.convert_tokens_to_ids("<|im_end|>") == thinker["text_config"]["eos_token_id"]
    ids = tok("a prompt, with ünïcode")["input_ids"]
    assert tok.decode(ids) == "a prompt, with ünïcode"
    proc = AutoProcessor.from_pretrained(bench)
    assert type(proc).__name__ == "Qwen2_5OmniProcessor" and proc.feature_extractor.feature_size == 128
    text = proc.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")


def test_round_check_and_fields() -> None:
    from benchmarks import peer_vllm_omni as peer
    from benchmarks.common.rounds import token_prompts

    args = peer.parse_args(["--thinker-tokens", "8", "--talker-codes", "50"])
    batch = token_prompts(3, 16, 5)
    found = "audio (Tensor, shapes [(24000,)]); keys ['audio']"  # what one_request records
    one = {"audio_s": 1.0, "thinker_tokens": 8, "sample_rate": 24000, "audio_outputs": 1, "found": found}
    reqs = [{"first_s": t, "last_audio_s": t, "done_s": t, **one} for t in (1.0, 2.0, 4.0)]
    got = peer.summarize(batch, reqs, 4.0, args)
    assert got["first_audio_p50_s"] == 2.0 and got["audio_s_per_s"] == 0.75 and got["thinker_tok_s"] == 6.0
    assert got["rtf_mean"] == pytest.approx(7 / 3)
    assert set(peer.FIELDS) <= set(got)
    short = [dict(r) for r in reqs]
    short[1]["audio_s"] = 0.98
    with pytest.raises(RuntimeError, match="1 of 3 requests differ") as err:
        peer.summarize(batch, short, 4.0, args)
    assert found in str(err.value)  # what the payload was, for a round that fails
    with pytest.raises(RuntimeError, match="not distinct"):
        peer.summarize([batch[0]] * 3, reqs, 4.0, args)


@needs_peer
def test_overlays_resolve_with_vllm_omnis_loader(tmp_path: Path) -> None:
    """The overlays, loaded by vllm-omni's own deploy loader (in a child with PEER_SITE on its path)."""
    from benchmarks import peer_vllm_omni as peer

    code = (
        "import json, sys\n"
        "from vllm_omni.config.stage_config import load_deploy_config\n"
        "d = load_deploy_config(sys.argv[1])\n"
        "print(json.dumps([[s.devices, s.gpu_memory_utilization, s.max_num_seqs, s.load_format,"
        " s.default_sampling_params] for s in d.stages]))\n"
    )
    for config, seqs in (("shipped", 1), ("seqs64", 64)):
        overlay, shas = peer.render_overlay(config, PEER_SITE, tmp_path / config)
        assert set(shas) == {"qwen2_5_omni.yaml", *peer.CONFIGS.values()}
        run = subprocess.run(
            [sys.executable, "-c", code, str(overlay)], env=peer.child_env(PEER_SITE), capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr[-2000:]
        stages = json.loads(run.stdout.strip().splitlines()[-1])
        assert [s[0] for s in stages] == ["0", "0", "0"] and [s[2] for s in stages] == [seqs] * 3
        assert [s[3] for s in stages] == ["dummy"] * 3 and sum(s[1] for s in stages) <= 0.95
        assert stages[0][4]["max_tokens"] == 128 and stages[1][4]["max_tokens"] == 200
        assert stages[0][4]["ignore_eos"] and stages[1][4]["ignore_eos"]
        assert stages[1][4]["temperature"] == 0.9  # the rest as shipped


@needs_peer
def test_empty_vllm_plugins_keeps_vllm_omni_out() -> None:
    """benchmarks.omni_gpu sets VLLM_PLUGINS="": even with vllm-omni importable, vLLM loads none of its plugins."""
    from benchmarks import peer_vllm_omni as peer

    code = (
        "import sys\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "print('OMNI' if any(m.startswith('vllm_omni') for m in sys.modules) else 'CLEAN')\n"
    )
    for value, want in (("", "CLEAN"), (None, "OMNI")):
        env = peer.child_env(PEER_SITE)
        if value is not None:
            env["VLLM_PLUGINS"] = value
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == want, run.stderr[-2000:]


@needs_peer
def test_failed_run_is_written_with_its_error_and_reported(tmp_path: Path) -> None:
    """vllm-omni on this CPU host: its run fails; the result file holds the error, and omni_gpu's
    report lists it next to omni_mp's levels."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "benchmarks.peer_vllm_omni", "--smoke", "--peer-site", str(PEER_SITE)]
    cmd += ["--out", str(tmp_path), "--work-dir", str(tmp_path / "models"), "--deadline-s", "300"]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    doc = json.loads((tmp_path / "vllm_omni_shipped.json").read_text())
    assert doc["system"].startswith("vllm-omni ") and doc["config"] == "shipped"
    assert "NotImplementedError" in doc["error"] and "1" not in doc  # no level was measured
    assert doc["yaml_sha256"]["qwen2_5_omni.yaml"] and Path(doc["model_dir"]).is_dir()
    report = subprocess.run(
        [sys.executable, "-m", "benchmarks.omni_gpu", "--smoke", "--phases", "", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    md = (tmp_path / "omni_gpu.md").read_text()
    assert "config shipped" in md and "run failed: vllm_omni_shipped.json: RuntimeError" in md, report.stdout[-3000:]


def test_parts_of_one_config_merge_in_the_report(tmp_path: Path) -> None:
    """Levels of one config measured in separate device calls (--part) make one table; every
    error stays, whichever call it came from."""
    from benchmarks.common import peer_report as peer

    def level(p50: float) -> dict[str, float]:
        return {"wall_s": 10.0, "first_audio_p50_s": p50, "first_audio_p90_s": p50 * 1.5, "rtf_mean": 2.0,
                "audio_s_per_s": 4.0, "thinker_tok_s": 100.0, "audio_s_per_request": 4.0}  # fmt: skip

    base = {"system": "vllm-omni 0.25.0rc1", "config": "shipped", "overlay": "o.yaml"}
    (tmp_path / "vllm_omni_shipped.a.json").write_text(
        json.dumps({**base, "1": level(8.0), "8": level(30.0), "errors": {"32": "RuntimeError: boom"}})
    )
    (tmp_path / "vllm_omni_shipped.b.json").write_text(json.dumps({**base, "error": "child exit killed at 540 s"}))
    docs = peer.peer_docs(tmp_path)
    assert list(docs) == ["shipped"] and docs["shipped"]["errors"] == {"32": "RuntimeError: boom"}
    stream = {"1": level(0.3), "8": level(0.5)}
    stream["8"]["audio_s_per_s"] = 40.0
    md = "\n".join(peer.peer_table(tmp_path, [1, 8, 32, 64], stream))
    assert md.count("config shipped") == 1
    assert "| 1 | 8000 / 12000 ms | 300 ms |" in md and "| 10.0x |" in md  # omni_mp's 40 vs its 4 audio s/s
    assert "| 32 | RuntimeError: boom |" in md and "| 64 | failed (below) |" in md
    assert "run failed: vllm_omni_shipped.b.json: child exit killed at 540 s" in md


def test_qwen3_round_check_allows_a_short_tail_only() -> None:
    """Qwen3-Omni: 200 frames x 1920 samples = 16.0 s; less than one frame short passes (vllm-omni's
    causal decoder leaves a tail off), a frame short or any sample more fails the round."""
    from benchmarks import peer_vllm_omni as peer

    args = peer.parse_args(["--family", "qwen3_omni", "--thinker-tokens", "8"])
    assert (args.prompt_len, args.talker_codes, args.concurrency) == (2500, 200, [1, 8, 32, 64])
    batch = [[i] * 4 for i in range(2)]
    one = {"thinker_tokens": 8, "sample_rate": 24000, "audio_outputs": 8, "found": "audio"}

    def reqs(samples: int) -> list[dict]:
        return [{"first_s": 1.0, "last_audio_s": 2.0, "done_s": 2.0, "audio_s": samples / 24000, **one}] * 2

    assert peer.summarize(batch, reqs(384000 - 555), 4.0, args)["audio_s_expected"] == 16.0
    for samples in (384000 - 1920, 384001):
        with pytest.raises(RuntimeError, match="2 of 2 requests differ"):
            peer.summarize(batch, reqs(samples), 4.0, args)


def test_peer_docs_keep_families_apart(tmp_path: Path) -> None:
    from benchmarks.common import peer_report as peer

    (tmp_path / "vllm_omni_shipped.json").write_text(json.dumps({"config": "shipped", "error": "q25"}))
    doc = {"config": "shipped", "family": "qwen3_omni", "error": "q3"}
    (tmp_path / "vllm_omni_qwen3_omni_shipped.json").write_text(json.dumps(doc))
    assert peer.peer_docs(tmp_path)["shipped"]["run_errors"] == ["vllm_omni_shipped.json: q25"]
    assert peer.peer_docs(tmp_path, "qwen3_omni")["shipped"]["run_errors"] == ["vllm_omni_qwen3_omni_shipped.json: q3"]
    md = "\n".join(peer.peer_table(tmp_path, [1], {}, "qwen3_omni"))
    assert "first streamed chunk" in md and "q25" not in md


def test_qwen3_bench_dir_has_the_released_special_ids(tmp_path: Path) -> None:
    """The Qwen3-Omni processor files beside a config dir: every config id names the released token."""
    from transformers import AutoProcessor, AutoTokenizer

    from benchmarks.common.omni_bench_dir import with_processor
    from omni_mp.models.qwen3_omni.tiny import RELEASED_TOKEN_IDS

    src = tmp_path / "released"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"stand_in": True}))  # the tokenizer does not read it
    bench = with_processor(src, "qwen3_omni")
    tok = AutoTokenizer.from_pretrained(bench)
    # The config's own, and each role's id: the token after <|im_start|> as this tokenizer writes it
    # (the talker finds the turns by them; the byte-level vocabulary has no single token for the words).
    roles = {f"{r}_token_id": tok(f"<|im_start|>{r}\n").input_ids[1] for r in ("system", "user", "assistant")}
    assert json.loads((bench / "config.json").read_text()) == {"stand_in": True, **roles}
    assert len(set(roles.values())) == 3 and json.loads((src / "config.json").read_text()) == {"stand_in": True}
    assert len(tok) == 151676
    assert tok.convert_tokens_to_ids("<|audio_pad|>") == RELEASED_TOKEN_IDS["audio_token_id"]
    assert tok.convert_tokens_to_ids("<tts_text_eod>") == RELEASED_TOKEN_IDS["tts_eos_token_id"]
    proc = AutoProcessor.from_pretrained(bench)
    assert type(proc).__name__ == "Qwen3OmniMoeProcessor" and (bench / "preprocessor_config.json").is_file()


@needs_peer
def test_qwen3_overlay_resolves_on_one_device(tmp_path: Path) -> None:
    from benchmarks import peer_vllm_omni as peer

    code = (
        "import json, sys\n"
        "from vllm_omni.config.stage_config import load_deploy_config\n"
        "d = load_deploy_config(sys.argv[1])\n"
        "print(json.dumps([d.async_chunk, [[s.devices, s.gpu_memory_utilization, s.max_num_seqs, s.load_format,"
        " s.default_sampling_params] for s in d.stages]]))\n"
    )
    overlay, shas = peer.render_overlay("shipped", PEER_SITE, tmp_path, "qwen3_omni")
    assert set(shas) == {"qwen3_omni_moe.yaml", "qwen3_omni_1gpu.yaml"}
    run = subprocess.run(
        [sys.executable, "-c", code, str(overlay)], env=peer.child_env(PEER_SITE), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    chunk, stages = json.loads(run.stdout.strip().splitlines()[-1])
    assert chunk and [s[0] for s in stages] == ["0", "0", "0"] and [s[2] for s in stages] == [64] * 3
    assert [s[3] for s in stages] == ["dummy", "dummy", None] and sum(s[1] for s in stages) <= 0.9 + 1e-9
    assert stages[0][4]["max_tokens"] == 200 and stages[1][4]["max_tokens"] == 201
    assert stages[1][4]["temperature"] == 0.9  # the rest as shipped


def test_closed_loop_keeps_c_in_flight_and_times_each_request_from_its_submit() -> None:
    """rounds.closed_loop (vLLM bench serve's --max-concurrency): never more than c requests in
    flight, each prompt run once, the next submitted as one finishes, each request's times from its
    own submission."""
    import asyncio
    import time

    from benchmarks.common import rounds

    running, peak, submits = 0, 0, []

    async def one(prompt: list[int], t0: float) -> dict:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        submits.append(t0)
        await asyncio.sleep(0.02 * (1 + prompt[0] % 3))  # requests of different lengths
        running -= 1
        return {"prompt": prompt[0], "first_s": time.perf_counter() - t0}

    batch = [[i] for i in range(10)]
    reqs, wall = asyncio.run(rounds.closed_loop(one, batch, 3))
    assert peak == 3 and sorted(r["prompt"] for r in reqs) == list(range(10))
    assert all(0.02 <= r["first_s"] < 0.2 for r in reqs)  # from its own submission, not the loop's start
    assert max(submits) - min(submits) > 0.03 and wall >= 0.02 * 10 * 2 / 3 - 1e-3  # staggered, not a burst
    reqs, _ = asyncio.run(rounds.closed_loop(one, batch[:2], 8))  # fewer prompts than c: no idle workers
    assert sorted(r["prompt"] for r in reqs) == [0, 1]


def test_closed_loop_rows_beside_omni_mps_and_merged_from_parts(tmp_path: Path) -> None:
    from benchmarks.common import peer_report as peer

    def closed(mean: float, rtf: float, audio: float) -> dict[str, float]:
        return {"requests": 128, "first_audio_mean_s": mean, "first_audio_p50_s": mean * 0.9,
                "rtf_mean": rtf, "audio_s_per_s": audio}  # fmt: skip

    base = {"system": "vllm-omni 0.25.0rc1", "config": "shipped", "overlay": "o.yaml", "family": "qwen3_omni"}
    (tmp_path / "vllm_omni_qwen3_omni_shipped.a.json").write_text(
        json.dumps({**base, "closed": {"8": closed(1.0, 0.5, 16.0)}})
    )
    (tmp_path / "vllm_omni_qwen3_omni_shipped.b.json").write_text(
        json.dumps({**base, "closed": {"32": closed(3.0, 1.0, 32.0)}})
    )
    doc = peer.peer_docs(tmp_path, "qwen3_omni")["shipped"]
    assert sorted(doc["closed"]) == ["32", "8"]
    ours = {"closed": {"32": closed(0.4, 0.4, 80.0)}}
    md = "\n".join(peer.peer_table(tmp_path, [8, 32], ours, "qwen3_omni"))
    assert "| 32 | 128 | 3000 / 2700 ms | 400 / 360 ms | 1.000 | 0.400 | 32.00 | 2.5x |" in md
    assert "| 8 | 128 | 1000 / 900 ms | - | 0.500 | - | 16.00 | - |" in md


def test_playback_counts_the_silence_a_listener_hears() -> None:
    """rounds.Playback: a player starting at the first chunk; a chunk that arrives after the
    audio before it has played out adds the gap as silence, one that arrives in time adds none."""
    from benchmarks.common import rounds

    start, first, second = 10.0, 0.08, 1.0
    p = rounds.Playback()
    p.chunk(start, first)
    p.chunk(start + first / 2, second)  # arrives while the first chunk plays
    assert p.stall_s == 0 and p.stalls == 0
    ran_out = start + first + second
    p.chunk(ran_out + 0.42, second)
    assert p.stalls == 1 and p.stall_s == pytest.approx(0.42)
    assert p.ends_at == pytest.approx(ran_out + 0.42 + second)


def test_qwen3_tts_dir_is_the_one_the_peer_overlay_names() -> None:
    """The peer overlay suppresses the released codec EOS id; the benchmark's voice is a preset."""
    from benchmarks import peer_tts_serve as serve
    from omni_mp.models.qwen3_tts.released_config import released_top_config

    talker = released_top_config()["talker_config"]
    assert talker["codec_eos_token_id"] == serve.SUPPRESSED_EOS
    assert serve.VOICE in {name.lower() for name in talker["spk_id"]}


@needs_peer
def test_qwen3_tts_overlay_resolves_as_shipped_with_eos_suppressed(tmp_path: Path) -> None:
    """vllm-omni's loader on the Qwen3-TTS overlay: the shipped stages (one GPU, 64 sequences, async
    chunks), the talker dummy-loaded with its EOS biased out, its sampling as shipped."""
    from benchmarks import peer_tts_serve as serve
    from benchmarks.common.peer_site import copy_overlays

    shas = copy_overlays(serve.BASE_YAML, [serve.OVERLAY], PEER_SITE, tmp_path)
    assert set(shas) == {serve.BASE_YAML, serve.OVERLAY}
    got = serve.resolve(tmp_path / serve.OVERLAY, PEER_SITE)
    assert got["async_chunk"] and got["stages"] == [[0, "0", 0.3, 64, "dummy"], [1, "0", 0.3, 64, None]]
    talker = got["talker"]
    assert talker["logit_bias"] == {str(serve.SUPPRESSED_EOS): -100.0}  # JSON keys
    assert (talker["temperature"], talker["top_k"], talker["min_tokens"]) == (0.9, 50, 2)


@needs_peer
def test_qwen3_tts_decoder_tensors_are_vllm_omnis_code2wav_parameters(tmp_path: Path) -> None:
    """vllm-omni's code2wav loads the dir's speech_tokenizer `decoder.*` tensors strictly: the names
    and shapes our builder writes (tiny sizes here, the released sizes' builder is the same) are
    exactly its decoder's parameters, built from the same config."""
    from benchmarks import peer_vllm_omni as peer
    from omni_mp.models.qwen3_tts.tiny import TINY_SPECS, decoder_weights
    from omni_mp.models.qwen3_tts.tiny_config import decoder_config, speech_tokenizer_config

    spec = TINY_SPECS["tiny-qwen3-tts-custom-voice"]
    (tmp_path / "config.json").write_text(json.dumps(speech_tokenizer_config(spec)))
    ours = {k: list(v.shape) for k, v in decoder_weights(decoder_config(spec), spec.seed).items()}
    code = (
        "import json, sys, torch\n"
        "from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 "
        "import Qwen3TTSTokenizerV2Config as C\n"
        "from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 "
        "import Qwen3TTSTokenizerV2Decoder as D\n"
        "with torch.device('meta'):\n"
        "    dec = D._from_config(C.from_pretrained(sys.argv[1]).decoder_config)\n"
        "print(json.dumps({f'decoder.{k}': list(v.shape) for k, v in dec.named_parameters()}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=peer.child_env(PEER_SITE), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == ours
