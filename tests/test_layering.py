"""Layering: a stage process imports nothing of the control plane (what both need lives in
`omni_mp.utils.procs`, `omni_mp.wire` and `omni_mp.utils.gpu_memory`), and neither the control plane nor
the stage loop names a `vllm_hooks*` module (vLLM internals are reached only through an engine
or a model family)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def package_modules(package: str) -> dict[str, Path]:
    """Module name -> file, for every module of `omni_mp.<package>` (the package itself too)."""
    out = {}
    for path in sorted((REPO / "omni_mp" / package).glob("*.py")):
        name = f"omni_mp.{package}" if path.stem == "__init__" else f"omni_mp.{package}.{path.stem}"
        out[name] = path
    return out


def named_imports(source: str, package: str) -> set[str]:
    """Every module an import statement of `source` names, at any depth (imports inside
    functions too); `package` resolves relative ones. `from a import b` names a and a.b."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            names |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return names


def loaded_on_import(module: str) -> set[str]:
    """The omni_mp modules a fresh interpreter holds once `module` is imported."""
    code = (
        "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('omni_mp'))))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code, module], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"import {module} failed:\n{proc.stderr[-3000:]}"
    return set(json.loads(proc.stdout.splitlines()[-1]))


def is_control(name: str) -> bool:
    return name == "omni_mp.control" or name.startswith("omni_mp.control.")


def is_vllm_hooks(name: str) -> bool:
    return any(part.startswith("vllm_hooks") for part in name.split("."))


STAGE = package_modules("stage")
CONTROL = package_modules("control")


@pytest.mark.parametrize("module", sorted(STAGE))
def test_the_stage_process_imports_nothing_of_the_control_plane(module: str) -> None:
    package = module.rsplit(".", 1)[0]
    named = {n for n in named_imports(STAGE[module].read_text(), package) if is_control(n)}
    assert not named, f"{module} imports {sorted(named)}"
    loaded = {n for n in loaded_on_import(module) if is_control(n)}
    assert not loaded, f"importing {module} loads {sorted(loaded)}"


@pytest.mark.parametrize("module", sorted({**CONTROL, **STAGE}))
def test_neither_plane_names_a_vllm_hooks_module(module: str) -> None:
    """The stage loop reaches vLLM only through the engine protocol (omni_mp.engines.base),
    the control plane not at all: vLLM internals stay in the `vllm_hooks*` modules."""
    path = {**CONTROL, **STAGE}[module]
    package = module if path.stem == "__init__" else module.rsplit(".", 1)[0]
    named = {n for n in named_imports(path.read_text(), package) if is_vllm_hooks(n)}
    assert not named, f"{module} imports {sorted(named)}"


def test_the_checks_see_imports_inside_functions_and_relative_ones() -> None:
    src = (
        "import omni_mp.engines.vllm_hooks_talker as t\n"
        "def f():\n    from omni_mp.control.endpoints import RunEndpoints\n"
        "from .io_threads import Inbox\nfrom ..utils import procs\n"
    )
    names = named_imports(src, "omni_mp.stage")
    control = {"omni_mp.control.endpoints", "omni_mp.control.endpoints.RunEndpoints"}
    assert {n for n in names if is_control(n)} == control
    assert {n for n in names if is_vllm_hooks(n)} == {"omni_mp.engines.vllm_hooks_talker"}
    assert {"omni_mp.stage.io_threads.Inbox", "omni_mp.utils.procs"} <= names
    assert len(STAGE) >= 5 and "omni_mp.control.coordinator" in CONTROL  # the walk found the packages


# ---- benchmarks/ and tests/ (issue 46) ------------------------------------------------------------
BENCHMARKS = {
    ("benchmarks." + str(p.relative_to(REPO / "benchmarks").with_suffix("")).replace("/", ".")).removesuffix(
        ".__init__"
    ): p
    for p in sorted((REPO / "benchmarks").rglob("*.py"))
}
RUNNERS = {name for name in BENCHMARKS if name.count(".") == 1 and not name.startswith("benchmarks.common")}


@pytest.mark.parametrize("module", sorted(BENCHMARKS))
def test_a_benchmark_imports_no_other_runner_and_nothing_of_the_tests(module: str) -> None:
    """What runners share lives in benchmarks.common: a runner imports no other runner (no import
    circle, no module loaded twice under two names), common imports no runner, and nothing in
    benchmarks/ imports tests/ (the tests may import benchmarks, not the other way)."""
    named = named_imports(BENCHMARKS[module].read_text(), module)
    assert not {n for n in named if n.split(".")[0] == "tests"}, module
    runners = {n for n in named if n in RUNNERS or n.rsplit(".", 1)[0] in RUNNERS} - {module}
    assert not runners, f"{module} imports {sorted(runners)}"
    top = {n.split(".")[0] for n in named}
    assert not top & {p.stem for p in (REPO / "benchmarks").glob("*.py")}, f"{module}: a runner imported by bare name"


@pytest.mark.parametrize("folder", ["benchmarks", "tests"])
def test_no_sys_path_insert(folder: str) -> None:
    """Runners run as `python -m benchmarks.<name>` from the checkout, tests under pytest: neither
    edits sys.path."""

    def edits_sys_path(node: ast.AST) -> bool:  # sys.path.insert(...) / .append(...)
        f = getattr(node, "func", None)
        return isinstance(f, ast.Attribute) and ast.unparse(f.value) == "sys.path" and f.attr in ("insert", "append")

    found = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / folder).rglob("*.py"))
        if any(edits_sys_path(n) for n in ast.walk(ast.parse(p.read_text())))
    ]
    assert found == [], found


def test_tests_import_no_private_benchmark_names() -> None:
    """What a test needs of benchmarks/ is public there (benchmarks.common): no `_name` imported."""
    private = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []


def test_every_runner_is_a_module_of_the_package() -> None:
    """benchmarks/ is a package (run as `python -m benchmarks.<name>`), benchmarks/common too."""
    assert (REPO / "benchmarks" / "__init__.py").is_file()
    assert (REPO / "benchmarks" / "common" / "__init__.py").is_file()
    assert "benchmarks.omni_gpu" in RUNNERS and "benchmarks.common.rounds" not in RUNNERS
