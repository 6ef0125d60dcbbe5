"""The model registry (omni_mp.models.registry): the families it lists and what they serve,
built-in checkpoint names, config validation against it, and the import graph it keeps clean
(the runtime never imports a tiny-checkpoint builder; no omni_mp module needs another to be
imported first)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_mp.config.schema import ConfigError
from omni_mp.config.validate import parse_config
from omni_mp.models import generic, registry
from omni_mp.models.processor import StageProcessor

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "omni_mp"


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def _builder_modules() -> set[str]:
    """The modules behind the built-in checkpoint names, and the 7B-shape writer."""
    builders = {load().__module__ for f in registry.families() for load in f.builtin_models.values()}
    return builders | {"omni_mp.models.qwen2_5_omni.shapes"}


def test_registry_lists_the_families() -> None:
    families = registry.families()
    names = [f.name for f in families]
    assert names[0] == "generic" and len(names) == len(set(names)) == 1 + len(registry.FAMILY_PACKAGES)
    for package, family in zip(registry.FAMILY_PACKAGES, families[1:], strict=True):
        assert package.FAMILY is family
    omni = families[names.index("qwen2_5_omni")]
    assert "qwen2_5_omni_talker" in omni.processors and "qwen2_5_omni" in omni.prompt_formats
    assert "talker" in omni.model_parts and "qwen2_5_omni_token2wav" in omni.diffusion_models
    for kind in registry.KINDS:
        assert registry.names(kind) == sorted(n for f in families for n in getattr(f, kind))


def test_every_reference_resolves() -> None:
    """Each name's loader imports its code (a typo would otherwise surface only when a stage runs)."""
    for family in registry.families():
        for kind in registry.KINDS:
            for name, ref in getattr(family, kind).items():
                target = ref()  # prompt formats and sizings are objects, the rest classes or functions
                assert kind in ("prompt_formats", "checkpoint_types") or callable(target), (
                    family.name,
                    kind,
                    name,
                    ref,
                )
    for model_type in registry.names("checkpoint_types"):
        sizing = registry.checkpoint_sizing(model_type)
        assert sizing is not None and callable(sizing.part) and callable(sizing.diffusion_activations)
    assert registry.checkpoint_sizing("qwen2") is None  # a plain causal LM: sized whole
    for name in registry.names("processors"):
        assert isinstance(registry.stage_processor(name), StageProcessor)
        assert registry.stage_processor(name) is registry.stage_processor(name)  # one shared instance
    for name in registry.names("prompt_formats"):
        fmt = registry.prompt_format(name)
        assert fmt.audio_rate > 0 and "hello" in fmt.render("hello", n_audio=1, n_image=2)


def test_builtin_names_match_the_builders() -> None:
    from omni_mp.models.generic import tiny
    from omni_mp.models.qwen2_5_omni import tiny as omni_tiny
    from omni_mp.models.qwen3_omni import tiny as q3_tiny
    from omni_mp.models.qwen3_omni import tiny_code2wav as q3_c2w
    from omni_mp.models.qwen3_tts import tiny as tts_tiny
    from omni_mp.models.qwen_image import tiny as image_tiny

    specs = {*tiny.BUILTIN_SPECS, *omni_tiny.TOKEN2WAV_SPECS, *omni_tiny.OMNI_SPECS, *image_tiny.SPECS}
    specs |= {*q3_tiny.TINY_SPECS, *q3_c2w.TINY_CODE2WAV_SPECS, *tts_tiny.TINY_SPECS}
    assert set(registry.names("builtin_models")) == specs


def test_resolve_builtin_and_unknown_names(tmp_path: Path) -> None:
    from omni_mp.models.generic.tiny import BUILTIN_SPECS, build_tiny_model

    built = registry.resolve_model("tiny-qwen2")
    assert built == str(build_tiny_model(BUILTIN_SPECS["tiny-qwen2"]))
    assert (Path(built) / "config.json").exists()
    assert registry.resolve_model(str(tmp_path)) == str(tmp_path)  # a path is returned as is
    with pytest.raises(registry.RegistryError) as err:
        registry.builtin_model("tiny-nope")
    assert "unknown built-in model 'tiny-nope'" in str(err.value)
    assert str(registry.names("builtin_models")) in str(err.value)


def _pipeline(**entry: object) -> dict[str, object]:
    return {"name": "p", "stages": [{"id": 0, "model": "tiny-qwen2", "final_output": True, **entry}]}


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [("prompt_format", "chatml9", "prompt_formats"), ("model_part", "vocoder", "model_parts")],
)
def test_config_names_checked_against_registry(field: str, value: str, kind: registry.Kind) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_pipeline(**{field: value}), check_engine_args=False)
    assert f"`stages[0].{field}`: unknown" in str(err.value) and str(registry.names(kind)) in str(err.value)
    known = registry.names(kind)[0]
    assert getattr(parse_config(_pipeline(**{field: known}), check_engine_args=False).stages[0], field) == known


def test_diffusion_model_type_checked_against_registry() -> None:
    stage = {"kind": "diffusion", "diffusion": {"model_type": "wavenet"}}
    with pytest.raises(ConfigError) as err:
        parse_config(_pipeline(**stage), check_engine_args=False)
    assert "`stages[0].diffusion.model_type`: unknown diffusion model type 'wavenet'" in str(err.value)
    assert str(registry.names("diffusion_models")) in str(err.value)


@pytest.mark.parametrize("module", ["omni_mp.stage.loop", "omni_mp.config.validate", "omni_mp.stage.media"])
def test_runtime_imports_no_builder(module: str) -> None:
    """Importing the runtime imports no checkpoint builder, and config imports no family code."""
    proc = _run(f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))")
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert module in loaded and not loaded & _builder_modules()
    if module == "omni_mp.config.validate":
        family_code = {m for m in loaded if m.startswith("omni_mp.models.qwen2_5_omni.")}
        assert not family_code and "omni_mp.models.processor" not in loaded


def _import_edges(module: str) -> set[str]:
    """omni_mp modules `module` imports when it runs (module level or in a function), not
    those imported for type checking only."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    known = set(_modules())
    # Importing a package's submodule runs the package first: not an edge worth a cycle.
    return {m for m in found if m in known and m != module and not module.startswith(f"{m}.")}


def test_no_import_cycle_in_source() -> None:
    graph = {m: _import_edges(m) for m in _modules()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == 2:
            return
        assert state.get(node) != 1, f"import cycle: {' -> '.join(path[path.index(node) :] + [node])}"
        state[node] = 1
        for dep in sorted(graph[node]):
            visit(dep, path + [node])
        state[node] = 2

    for module in graph:
        visit(module, [])


# Imports every module named in argv in a child forked from an interpreter that has imported
# heavy third-party packages but nothing of omni_mp: each child starts with no omni_mp module.
# (vLLM's engine, runner and models among them: each child importing a vllm_hooks module or an
# engine would otherwise import vLLM anew, 10-15 s of a core apiece.)
_FORK_IMPORTS = """
import importlib, json, os, sys
import msgspec, numpy, torch, transformers, yaml, zmq
import vllm.engine.arg_utils, vllm.model_executor.models.qwen2, vllm.v1.engine.core
assert not any(m.startswith("omni_mp") for m in sys.modules)
failed = {}
for name in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
        except BaseException as err:
            os.write(w, repr(err).encode()[:2000])
            os._exit(1)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        msg = fh.read().decode()
    if os.waitpid(pid, 0)[1] != 0:
        failed[name] = msg or "exited with an error"
print(json.dumps(failed))
"""


def test_each_module_imports_alone() -> None:
    """Every omni_mp module imports with no other omni_mp module imported before it (a cycle
    would fail on a partially initialised module)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-c", _FORK_IMPORTS, *_modules()]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {}


def test_declared_processor_traits_are_the_classes_own() -> None:
    """Config validation reads each processor's traits from its family's declaration (data); they
    must say what the class itself says."""
    for name in registry.names("processors"):
        declared, cls = registry.processor_traits(name), type(registry.stage_processor(name))
        for trait in ("needs_hidden_states", "feeds_diffusion", "prompt_rows"):
            assert getattr(declared, trait) == getattr(cls, trait), (name, trait)


def test_validating_every_shipped_config_imports_no_family_code_and_no_torch() -> None:
    """The registry's promise: validation (engine args aside, which import vLLM) reads the
    families' declarations only."""
    code = (
        "import json, sys\n"
        "from omni_mp.config.validate import load_config\n"
        "from omni_mp.stage_configs import shipped, shipped_config\n"
        "for name in shipped():\n"
        "    load_config(shipped_config(name), check_engine_args=False)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    families = {p.__name__ for p in (*registry.FAMILY_PACKAGES, generic)}
    family_code = {m for m in loaded if m.rsplit(".", 1)[0] in families}
    assert not family_code, sorted(family_code)
    assert "omni_mp.models.generic.processors" not in loaded and "omni_mp.models.processor" not in loaded
    assert "torch" not in loaded and "transformers" not in loaded and "vllm" not in loaded
