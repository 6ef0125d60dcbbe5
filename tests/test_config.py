"""Pipeline YAML validation: unknown keys, graph errors and processors are rejected with the key path."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from omni_mp.config.schema import ConfigError
from omni_mp.config.validate import load_config, parse_config
from omni_mp.stage_configs import CONFIG_DIR

REPO = Path(__file__).resolve().parent.parent
TINY_CHAIN = CONFIG_DIR / "tiny_chain.yaml"


def base() -> dict[str, Any]:
    return yaml.safe_load(TINY_CHAIN.read_text())


def test_shipped_configs_load() -> None:
    for path in sorted((CONFIG_DIR).glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.stages, path


def test_tiny_chain_shape() -> None:
    cfg = load_config(TINY_CHAIN)
    assert [s.id for s in cfg.entry_stages] == [0]
    assert [s.id for s in cfg.final_stages] == [1]
    assert cfg.downstream(0) == [1]


def mutate(path: list[Any], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(base())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["stages", 1, "colour"], "red", "`stages[1]`"),
        (["stages", 0, "sampling", "max_tokenz"], 3, "`stages[0].sampling`"),
        (["limits"], {"max_message_bytes": "big"}, "`limits.max_message_bytes`"),
        (["limits"], {"max_ndim": 0}, "max_ndim must be > 0"),
        (["stages", 0, "engine_args", "mm_processor_cache_gb"], 4, "mm_processor_cache_gb`: must stay 0"),
        (["endpoints"], {"transport": "udp"}, "`endpoints.transport`"),
        (["stages", 0, "cpu_cores"], "0-x", "`stages[0].cpu_cores`"),
        (["stages", 1, "inputs"], [7], "`stages[1].inputs[0]`: unknown stage id 7"),
        (["stages", 1, "processor"], "my.module:func", "`stages[1].processor`: unknown processor 'my.module:func'"),
        (["stages", 1, "processor"], None, "`stages[1].processor`: required"),
        (["stages", 0, "engine_args", "not_an_arg"], 1, "`stages[0].engine_args.not_an_arg`"),
        (["stages", 0, "engine_args", "model"], "x", "`stages[0].engine_args.model`: set by omni_mp"),
        (["stages", 1, "id"], 0, "`stages[1].id`: stage id 0 is already used by stages[0]"),
        (["stages", 0, "kind"], "transformer", "`stages[0].kind`"),
        (["stages", 0, "devices"], [0, 0], "`stages[0].devices`"),
        (["stages", 1, "final_output"], False, "no stage has `final_output: true`"),
        (["timeouts"], {"heartbeat_timeout_s": float("nan")}, "`timeouts.heartbeat_timeout_s`"),
        (["timeouts"], {"stage_startup_s": -1}, "`timeouts.stage_startup_s`"),
        (["timeouts"], {"default_deadline_s": float("inf")}, "`timeouts.default_deadline_s`"),
        (["stages", 0, "restart"], {"backoff_s": float("nan")}, "`stages[0].restart.backoff_s`"),
        (["stages", 0, "restart"], {"max_restarts": -1}, "`stages[0].restart.max_restarts`"),
        (["admission"], {"max_inflight": 0}, "`admission.max_inflight`"),
        (["admission"], {"client_queue": "lots"}, "`admission.client_queue`"),
        (["security"], {"keys": 5}, "`security.keys`"),
        (["security"], {"allow_code_import": "yes"}, "`security.allow_code_import`"),
        (["limits"], {"max_list_length": 2**24}, "max_list_length must be <= 1048576"),
        (["stages", 0, "sampling", "temperature"], float("nan"), "`stages[0].sampling.temperature`"),
        (["stages", 0, "engine_args", "trust_remote_code"], True, "`stages[0].engine_args.trust_remote_code`"),
        (["stages"], [], "`stages`: a pipeline needs at least one stage"),
        (["name"], ["x"], "`name`"),
        (["placement"], {"kind": "slurm"}, "`placement.kind`"),
        (["placement"], {"kind": "ray"}, "`endpoints.transport`: placement 'ray' puts stages on other hosts"),
        (["placement"], {"strategy": "ANYWHERE"}, "`placement.strategy`"),
        (
            ["stages", 1, "ray_resources"],
            {"node_b": 0.01},
            "`stages[1].ray_resources`: only with `placement.kind: ray`",
        ),
        (["stages", 1, "ray_resources"], {"node_b": -1}, "`stages[1].ray_resources"),
    ],
)
def test_invalid_configs_name_the_key(path: list[Any], value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(mutate(path, value))
    assert message in str(err.value)


def test_engine_arg_names_read_from_source_are_vllms_fields() -> None:
    """What validation checks `engine_args` keys against (read from vLLM's source, not imported)
    is exactly the dataclass's field list."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    from omni_mp.engines.vllm_hooks_engine_args import _declared_fields, engine_arg_names

    assert engine_arg_names() == {f.name for f in dataclasses.fields(EngineArgs)}
    # a ClassVar is no field; a class with a base may inherit fields it does not declare
    source = "class EngineArgs:\n    a: int = 1\n    b: ClassVar[int] = 2\n    def c(self) -> int: ..."
    assert _declared_fields(source) == {"a"} and _declared_fields("class EngineArgs(Base):\n    a: int") is None


def test_builtin_load_formats_need_no_opt_in() -> None:
    data = base()
    data["stages"][0]["engine_args"]["load_format"] = "dummy"
    assert parse_config(data).stages[0].engine_args["load_format"] == "dummy"
    data["stages"][0]["engine_args"]["load_format"] = "my_plugin_loader"
    with pytest.raises(ConfigError, match=r"`stages\[0\]\.engine_args\.load_format`: lets vLLM import"):
        parse_config(data)


def test_cycle_is_rejected() -> None:
    data = base()
    data["stages"][0]["inputs"] = [1]
    data["stages"][0]["processor"] = "continue_tokens"
    data["stages"].append({**data["stages"][1], "id": 2, "inputs": [0]})
    with pytest.raises(ConfigError, match=r"cycle: (0 -> 1 -> 0|1 -> 0 -> 1)"):
        parse_config(data)


def test_cli_reports_bad_config_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(mutate(["stages", 1, "processor"], "os.system")))
    proc = subprocess.run(
        [sys.executable, "-m", "omni_mp.launch", "--config", str(bad), "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert "`stages[1].processor`: unknown processor 'os.system'" in proc.stderr
    assert str(bad) in proc.stderr


TINY_TTS = CONFIG_DIR / "tiny_tts.yaml"


@pytest.mark.parametrize(
    ("stage", "key", "value", "message"),
    [
        (1, "processor", "continue_tokens", "`stages[1].processor`: 'continue_tokens' does not feed a diffusion stage"),
        (1, "hidden_states", {}, "`stages[1]`: a diffusion stage has no hidden states"),
        (1, "warm_moe_kernels", True, "`stages[1].warm_moe_kernels`: only for AR stages"),
        (0, "warm_moe_kernels", False, None),  # an AR stage may turn it off
        (1, "engine_args", {"worker_cls": "x.Y"}, "`stages[1].engine_args.worker_cls`: set by the diffusion engine"),
        (1, "diffusion", {"streaming": {"chunk": 0}}, "`stages[1].diffusion.streaming.chunk`"),
        (1, "diffusion", {"defaults": {"solver": "dpm"}}, "`stages[1].diffusion.defaults.solver`"),
        (0, "diffusion", {"max_batch": 4}, "`stages[0].diffusion`: only for `kind: diffusion` stages"),
        (0, "kind", "ar", None),  # stays valid: the control case
    ],
)
def test_diffusion_stage_validation(stage: int, key: str, value: Any, message: str | None) -> None:
    data = yaml.safe_load(TINY_TTS.read_text())
    data["stages"][stage][key] = value
    if message is None:
        assert parse_config(data).stages[1].kind == "diffusion"
        return
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert message in str(err.value)


def test_codec_processor_only_feeds_diffusion_stages() -> None:
    data = base()
    data["stages"][1]["processor"] = "codec_tokens"
    with pytest.raises(ConfigError, match="'codec_tokens' feeds a diffusion stage, not an AR one"):
        parse_config(data)


def test_every_shipped_stage_has_a_restart_budget() -> None:
    for path in sorted((CONFIG_DIR).glob("*.yaml")):
        for stage in load_config(path, check_engine_args=False).stages:
            assert stage.restart.max_restarts > 0, f"{path.name}: stage {stage.id}"
