"""GPU memory budgets (omni_mp.control.memory_budget): weight estimates against real tiny
checkpoints, the per-stage and per-device checks with explicit device totals, the engine args
a budget becomes, and a bad budget failing `omni_mp.cli` before any stage starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
import torch
import yaml

from omni_mp.config.schema import ConfigError
from omni_mp.config.validate import load_config, parse_config
from omni_mp.control.memory_budget import (
    DeviceMemory,
    GiB,
    MemoryBudgetError,
    StageNeeds,
    apply_memory_plan,
    estimate_needs,
    meta_params,
    parse_nvidia_smi,
    plan_memory,
    resolve_memory_budgets,
    safetensors_params,
)
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav
from omni_mp.stage_configs import CONFIG_DIR

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def omni_dir() -> Path:
    return build_token2wav(TOKEN2WAV_SPECS["tiny-token2wav"])  # a full tiny Qwen2.5-Omni checkpoint


def _ar(model: str, **kw: Any) -> dict[str, Any]:
    stage = {"id": 0, "model": model, "devices": [0], "final_output": True, "memory": {"gpu_gib": 4}}
    stage["engine_args"] = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 8}
    stage.update(kw)
    return stage


def test_weights_of_a_plain_checkpoint_match_its_parameters(tiny_qwen2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir, dtype=torch.float32)
    actual = sum(p.numel() for p in model.parameters())
    assert safetensors_params(tiny_qwen2_dir, "all") == actual
    assert meta_params(tiny_qwen2_dir, "all") == actual
    cfg = parse_config({"name": "t", "stages": [_ar(str(tiny_qwen2_dir))]})
    needs = estimate_needs(cfg.stages[0], tiny_qwen2_dir)
    assert needs.weight_bytes == 4 * actual and "safetensors" in needs.weight_source
    dummy = _ar(str(tiny_qwen2_dir))
    dummy["engine_args"]["load_format"] = "dummy"
    needs = estimate_needs(parse_config({"name": "t", "stages": [dummy]}).stages[0], tiny_qwen2_dir)
    assert needs.weight_bytes == 4 * actual and "meta" in needs.weight_source
    # KV of one 1024-token request: 2 (K, V) x layers x kv heads x head_dim x 4 bytes per token.
    assert needs.min_kv_bytes == 1024 * 2 * 2 * 1 * 64 * 4


def test_weights_of_each_omni_part_match_the_real_model(omni_dir: Path) -> None:
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(omni_dir, dtype=torch.float32)
    for part in ("thinker", "talker", "token2wav"):
        actual = sum(p.numel() for p in getattr(model, part).parameters())
        assert safetensors_params(omni_dir, part) == actual, part
        assert meta_params(omni_dir, part) == actual, part
    towers = sum(p.numel() for n, p in model.thinker.named_parameters() if n.startswith(("audio_tower.", "visual.")))
    text_only = sum(p.numel() for p in model.thinker.parameters()) - towers
    skip = {"audio_tower.", "visual."}
    assert safetensors_params(omni_dir, "thinker", skip) == meta_params(omni_dir, "thinker", skip) == text_only
    # A thinker stage with every modality off: vLLM builds no tower, so none is counted.
    stage = _ar(str(omni_dir))
    stage["engine_args"]["limit_mm_per_prompt"] = {"image": 0, "video": 0, "audio": 0}
    needs = estimate_needs(parse_config({"name": "t", "stages": [stage]}).stages[0], omni_dir)
    assert needs.weight_bytes == 4 * text_only
    t2w = {"id": 0, "model": str(omni_dir), "kind": "diffusion", "devices": [0], "final_output": True}
    t2w["memory"] = {"gpu_gib": 4}
    needs = estimate_needs(parse_config({"name": "t", "stages": [t2w]}).stages[0], omni_dir)
    assert needs.weight_bytes == 4 * sum(p.numel() for p in model.token2wav.parameters())
    assert needs.min_kv_bytes == 0 and needs.activation_bytes > 0


def _three_stages(budgets: list[float], devices: list[int]) -> Any:
    stages = []
    for i, (gib, dev) in enumerate(zip(budgets, devices, strict=True)):
        s: dict[str, Any] = {"id": i, "model": "tiny-qwen2", "devices": [dev], "memory": {"gpu_gib": gib}}
        s.update({"inputs": [i - 1], "processor": "generated_tokens"} if i else {})
        stages.append(s)
    stages[-1]["final_output"] = True
    return parse_config({"name": "t", "stages": stages})


NEEDS = StageNeeds(weight_bytes=10 * GiB, weight_source="test", min_kv_bytes=GiB, activation_bytes=GiB)
H200 = {d: DeviceMemory(d, 140 * GiB, 139 * GiB) for d in (0, 1)}


def test_budgets_on_one_device_fit_and_become_engine_args() -> None:
    cfg = _three_stages([60, 40, 30], [0, 0, 0])
    plan = plan_memory(cfg, H200, needs=lambda s: NEEDS)
    for p in plan.stages:
        reserve = 2 * GiB  # the default reserve_gib
        assert p.kv_cache_bytes == p.budget_bytes - 10 * GiB - GiB - reserve
        assert p.gpu_memory_utilization == round((p.budget_bytes - GiB) / (140 * GiB), 4)
    args = [s.engine_args for s in apply_memory_plan(cfg, plan).stages]
    assert args[0] == {"kv_cache_memory_bytes": 47 * GiB, "gpu_memory_utilization": round(59 / 140, 4)}


def test_budgets_over_a_device_are_refused_with_the_numbers() -> None:
    plan_memory(_three_stages([99, 40, 30], [0, 0, 1]), H200, needs=lambda s: NEEDS)  # 139 GiB: fits
    cfg = _three_stages([100, 40, 30], [0, 0, 1])
    with pytest.raises(MemoryBudgetError, match=r"device 0: budgets stage 0 100.00 GiB \+ stage 1 40.00 GiB = "
                       r"140.00 GiB > 139.00 GiB free now \(of 140.00 GiB total\)"):  # fmt: skip
        plan_memory(cfg, H200, needs=lambda s: NEEDS)
    cfg = _three_stages([30, 30, 30], [0, 0, 2])
    with pytest.raises(MemoryBudgetError, match=r"device 2: not found \(this host has GPUs \[0, 1\]\)"):
        plan_memory(cfg, H200, needs=lambda s: NEEDS)


def test_a_budget_below_the_stage_needs_is_refused_naming_every_part() -> None:
    cfg = _three_stages([13.5, 12, 60], [0, 1, 1])
    with pytest.raises(MemoryBudgetError) as err:
        plan_memory(cfg, None, needs=lambda s: NEEDS)  # device totals unknown: per-stage check only
    msg = str(err.value)
    assert (
        "stage 0: memory.gpu_gib 13.5 (13.50 GiB) < 14.00 GiB needed = weights 10.00 GiB [test] + "
        "min KV cache (one max_model_len request) 1.00 GiB + activations 1.00 GiB + reserve 2.00 GiB"
    ) in msg
    assert "stage 1: memory.gpu_gib 12" in msg and "stage 2" not in msg


def test_real_estimate_refuses_a_small_budget(tiny_qwen2_dir: Path) -> None:
    stage = _ar(str(tiny_qwen2_dir), memory={"gpu_gib": 0.26, "reserve_gib": 0.25})
    cfg = parse_config({"name": "t", "stages": [stage]})
    with pytest.raises(MemoryBudgetError, match="stage 0: memory.gpu_gib 0.26 .* weights 0.00 GiB"):
        resolve_memory_budgets(cfg, devices=None)
    stage["memory"] = {"gpu_gib": 1, "reserve_gib": 0.25}
    resolved = resolve_memory_budgets(parse_config({"name": "t", "stages": [stage]}), devices=None)
    assert resolved.stages[0].engine_args["kv_cache_memory_bytes"] > GiB // 2
    assert "gpu_memory_utilization" not in resolved.stages[0].engine_args  # no device total known


def test_config_rules() -> None:
    stage = _ar("tiny-qwen2", devices=[])
    with pytest.raises(ConfigError, match=r"`stages\[0\].memory`: a GPU budget needs `devices`"):
        parse_config({"name": "t", "stages": [stage]})
    stage = _ar("tiny-qwen2")
    stage["engine_args"]["kv_cache_memory_bytes"] = 2**30
    with pytest.raises(ConfigError, match=r"`stages\[0\].engine_args.kv_cache_memory_bytes`: set from"):
        parse_config({"name": "t", "stages": [stage]})
    with pytest.raises(ConfigError, match=r"`stages\[0\].memory.gpu_gib`"):
        parse_config({"name": "t", "stages": [_ar("tiny-qwen2", memory={"gpu_gib": -1})]})


def test_nvidia_smi_output() -> None:
    devs = parse_nvidia_smi("0, 143771, 143000\n1, 143771, 100\n")
    assert devs[1] == DeviceMemory(1, 143771 * 2**20, 100 * 2**20)


def test_launch_fails_before_any_stage_starts(tmp_path: Path, tiny_qwen2_dir: Path) -> None:
    stage = _ar(str(tiny_qwen2_dir), memory={"gpu_gib": 0.06, "reserve_gib": 0.05})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "stages": [stage]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_mp.launch", "--config", str(path), "--prompt", "hi"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    spawned = []
    while proc.poll() is None:  # watch for a stage child while it runs
        try:
            spawned += [c.cmdline() for c in psutil.Process(proc.pid).children() if "omni_mp.stage" in c.cmdline()]
        except psutil.Error:
            pass
    _, err = proc.communicate()
    assert proc.returncode == 2, err
    assert "GPU memory budgets do not fit" in err and "stage 0: memory.gpu_gib 0.06" in err
    assert not spawned


def test_talker_part_with_dummy_weights_on_a_config_only_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `model_part: talker` stage with `load_format: dummy` on a dir without weight files
    (the 7B-shape writer's layout, scaled down): sized from the talker config alone, and the
    stage's talker view needs no weight files either."""
    from transformers import Qwen2_5OmniConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniTalkerForConditionalGeneration

    from omni_mp.models.qwen2_5_omni.shapes import OmniShapesSpec, write_omni_shapes
    from omni_mp.models.qwen2_5_omni.talker_view import talker_view_dir

    ckpt = write_omni_shapes(tmp_path / "ckpt", OmniShapesSpec(scale=28, token2wav_weights=False))
    assert not list(ckpt.glob("*.safetensors"))
    talker = {"id": 0, "model": str(ckpt), "model_part": "talker", "devices": [0], "final_output": True}
    talker["memory"] = {"gpu_gib": 4}
    talker["engine_args"] = {"dtype": "bfloat16", "load_format": "dummy", "max_model_len": 512}
    needs = estimate_needs(parse_config({"name": "t", "stages": [talker]}).stages[0], ckpt)
    config = Qwen2_5OmniConfig.from_pretrained(ckpt).talker_config
    with torch.device("meta"):
        actual = sum(p.numel() for p in Qwen2_5OmniTalkerForConditionalGeneration._from_config(config).parameters())
    assert needs.weight_bytes == 2 * actual and "talker" in needs.weight_source
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    assert needs.min_kv_bytes == 512 * per_token
    monkeypatch.setenv("OMNI_MP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        talker_view_dir(ckpt)
    view = talker_view_dir(ckpt, require_weights=False)
    assert sorted(p.name for p in view.iterdir()) == ["config.json"]


def test_shipped_qwen3_omni_budgets_cover_the_estimate(tmp_path: Path) -> None:
    """Every memory budget of omni_mp/stage_configs/qwen3_omni.yaml holds the planner's own estimate
    of its stage on one H200, so the launcher would not refuse the shipped config. The
    checkpoint is a config-only dir at the released sizes: with no safetensors, each part's
    weights are its parameter count on the meta device (the planner's fallback). Not vacuous:
    code2wav with 48-frame chunks (`max_chunk`) at the same max_batch (3.6x the activations)
    is refused, naming stage 2 alone."""
    from omni_mp.models.qwen3_omni.tiny import released_config

    released_config().save_pretrained(tmp_path)
    shipped = load_config(CONFIG_DIR / "qwen3_omni.yaml")
    cfg = msgspec.structs.replace(
        shipped, stages=[msgspec.structs.replace(s, model=str(tmp_path)) for s in shipped.stages]
    )
    plan = plan_memory(cfg, H200)  # plans only the stages with a budget: all three
    assert [p.stage_id for p in plan.stages] == [s.id for s in cfg.stages] == [0, 1, 2]
    code2wav = cfg.stages[2]
    assert code2wav.kind == "diffusion" and code2wav.memory is not None
    assert "code2wav" in plan.stages[2].needs.weight_source

    longer = msgspec.structs.replace(code2wav.diffusion.streaming, max_chunk=768)
    wider = msgspec.structs.replace(code2wav.diffusion, streaming=longer)
    refused = msgspec.structs.replace(cfg, stages=[*cfg.stages[:2], msgspec.structs.replace(code2wav, diffusion=wider)])
    with pytest.raises(MemoryBudgetError) as err:
        plan_memory(refused, H200)
    problems = [line.strip() for line in str(err.value).splitlines()[1:]]
    assert len(problems) == 1, err.value
    assert problems[0].startswith(f"stage 2: memory.gpu_gib {code2wav.memory.gpu_gib:g} "), err.value


def test_a_started_stage_over_its_budget_refuses_to_serve_naming_the_numbers() -> None:
    """omni_mp.stage.memory_check: what the process holds once started (the driver's count on a
    GPU host, given here) against its budget. The GPU benchmarks, whose stages have budgets, run
    the measuring path: each stage's Ready line shows what it uses."""
    from omni_mp.stage.memory_check import cap_gpu_memory, check_gpu_memory, out_of_budget

    stage = parse_config({"name": "t", "stages": [_ar("tiny-qwen2", devices=[0, 1])]}).stages[0]  # budget 4 GiB
    assert check_gpu_memory(stage, {0: 3 * GiB, 1: 4 * GiB}) == (
        "GPU 0: 3.00 of 4.00 GiB (driver); GPU 1: 4.00 of 4.00 GiB (driver)"
    )
    with pytest.raises(MemoryBudgetError) as err:
        check_gpu_memory(stage, {0: 3 * GiB, 1: int(5.5 * GiB)})
    msg = str(err.value)
    assert msg.startswith("stage 0: started, but uses 5.50 GiB on GPU 1 (driver), over its budget memory.gpu_gib 4")
    assert "Raise memory.reserve_gib by at least 1.5" in msg and "max_num_batched_tokens default" in msg
    cpu = parse_config({"name": "t", "stages": [_ar("tiny-qwen2", devices=[], memory=None)]}).stages[0]
    assert check_gpu_memory(cpu) is None  # a CPU stage has no GPU budget
    # PyTorch's out-of-memory while the engine starts under the cap, as the stage reports it
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 284.00 MiB. GPU 0 has a total capacity of ...")
    assert str(out_of_budget(stage, oom)).startswith(
        "stage 0: ran out of its GPU memory budget while starting (memory.gpu_gib 4, reserve_gib 2): "
        "CUDA out of memory. Tried to allocate 284.00 MiB. Raise memory.reserve_gib"
    )
    # a diffusion stage has no KV cache: its activations are sized by max_batch
    dit = {"id": 0, "model": "tiny-qwen2", "kind": "diffusion", "devices": [0], "final_output": True,
           "memory": {"gpu_gib": 4}, "diffusion": {"model_type": "qwen3_omni_code2wav", "max_batch": 64}}  # fmt: skip
    with pytest.raises(MemoryBudgetError) as err:
        check_gpu_memory(parse_config({"name": "t", "stages": [dit]}, check_engine_args=False).stages[0], {0: 5 * GiB})
    assert "workspaces at diffusion.max_batch 64" in str(err.value) and "KV cache" not in str(err.value)
    if not torch.cuda.is_available():  # nothing to measure or cap: no note, no cap
        assert check_gpu_memory(stage) is None and cap_gpu_memory(stage) is None
