"""Who may connect and what a YAML file may do: CURVE keys (files, sockets), import-capable
engine_args, and no pickle / eval / dynamic import reachable from the wire or the YAML."""

from __future__ import annotations

import ast
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from omni_mp.config.schema import ConfigError
from omni_mp.config.validate import IMPORT_CAPABLE_ENGINE_ARGS, parse_config
from omni_mp.wire.codec import encode
from omni_mp.wire.keys import INTERNAL, STAGE_DOMAIN, SecureContext, client_identity, generate, pipeline_identity
from omni_mp.wire.messages import Shutdown, StageRequest
from omni_mp.wire.transport import MessageReceiver, MessageSender
from tests.launcher import REPO

STAGES = [{"id": 0, "model": "tiny-qwen2", "final_output": True}]


def test_keys_command_writes_secret_files_0600(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    run = [sys.executable, "-m", "omni_mp.launch", "keys", str(d)]
    proc = subprocess.run([*run, "--client", "alice"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    secrets = sorted(p.name for p in d.glob("*.key_secret"))
    assert secrets == ["alice.key_secret", "internal.key_secret", "server.key_secret"]
    for p in d.rglob("*"):
        mode = stat.S_IMODE(p.stat().st_mode)
        if p.is_dir() or p.name.endswith("key_secret"):
            assert mode & 0o077 == 0, f"{p} is {mode:o}"
    # Adding a client later keeps the pipeline keys; a name is never overwritten.
    server = (d / "server.key_secret").read_text()
    assert subprocess.run([*run, "--client", "bob"], cwd=REPO, timeout=120, capture_output=True).returncode == 0
    assert (d / "server.key_secret").read_text() == server and (d / "clients" / "bob.key").is_file()
    again = subprocess.run([*run, "--client", "bob"], cwd=REPO, timeout=120, capture_output=True, text=True)
    assert again.returncode == 2 and "bob.key_secret" in again.stderr
    (d / "bob.key_secret").chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        client_identity(d, "bob")


def test_tcp_requires_keys_and_keys_must_exist(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"`security.keys`: tcp endpoints need CURVE keys: .*`omni-mp keys DIR --client NAME`"
    ):
        parse_config({"name": "p", "stages": STAGES, "endpoints": {"transport": "tcp"}}, check_engine_args=False)
    with pytest.raises(ConfigError, match=r"`security.keys`: .*server.key_secret: no such key file"):
        parse_config({"name": "p", "stages": STAGES, "security": {"keys": str(tmp_path)}}, check_engine_args=False)


@pytest.mark.parametrize("arg", sorted(IMPORT_CAPABLE_ENGINE_ARGS))
def test_import_capable_engine_args_need_the_opt_in(arg: str) -> None:
    stages = [{**STAGES[0], "engine_args": {arg: "os.system"}}]
    with pytest.raises(ConfigError, match=rf"`stages\[0\].engine_args.{arg}`: .*security.allow_code_import: true"):
        parse_config({"name": "p", "stages": stages})
    cfg = parse_config({"name": "p", "stages": stages, "security": {"allow_code_import": True}})
    assert cfg.stages[0].engine_args == {arg: "os.system"}


def test_graph_sizes_need_no_opt_in_but_other_compilation_keys_do() -> None:
    """CUDA graph sizes (what omni_mp/stage_configs/qwen3_omni.yaml sets for its prefill steps) name
    no code; a compilation backend or pass does, and still needs the opt-in."""
    graphs = {"cudagraph_capture_sizes": [1, 2, 4, 8, 512, 2048], "cudagraph_mode": "FULL_AND_PIECEWISE"}
    cfg = parse_config({"name": "p", "stages": [{**STAGES[0], "engine_args": {"compilation_config": graphs}}]})
    assert cfg.stages[0].engine_args["compilation_config"] == graphs
    for extra in ({"backend": "mypkg.compile"}, {"pass_config": {}}):
        stages = [{**STAGES[0], "engine_args": {"compilation_config": {**graphs, **extra}}}]
        with pytest.raises(ConfigError, match=r"engine_args.compilation_config`: .*allow_code_import"):
            parse_config({"name": "p", "stages": stages})
    stages = [{**STAGES[0], "engine_args": {"compilation_config": "mypkg.compile"}}]
    with pytest.raises(ConfigError, match=r"engine_args.compilation_config`: .*allow_code_import"):
        parse_config({"name": "p", "stages": stages})


def test_every_import_capable_name_is_an_engine_arg() -> None:
    """If vLLM renames one, the refusal would silently stop applying."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    assert IMPORT_CAPABLE_ENGINE_ARGS <= {f.name for f in dataclasses.fields(EngineArgs)}


# ---- CURVE on links --------------------------------------------------------------------------
def test_curve_links_admit_only_listed_keys(tmp_path: Path) -> None:
    generate(tmp_path, ["alice"])
    server_ctx = SecureContext()
    server_ctx.curve = pipeline_identity(tmp_path)
    auth = server_ctx.curve.start_authenticator(server_ctx, (STAGE_DOMAIN,))
    peer_ctx = SecureContext()
    peer_ctx.curve = pipeline_identity(tmp_path)
    stranger_ctx = SecureContext()  # a client key, not a stage key: not admitted on stage links
    stranger_ctx.curve = client_identity(tmp_path, "alice")
    plain = zmq.Context()
    try:
        rx = MessageReceiver(server_ctx, "tcp://127.0.0.1:*", accept_shm=False)
        endpoint = rx.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        raw = plain.socket(zmq.PUSH)  # no keys at all
        raw.connect(endpoint)
        raw.send_multipart(encode(Shutdown(reason="injected")))
        with MessageSender(stranger_ctx, endpoint, linger_ms=0) as wrong:
            wrong.send(Shutdown(reason="wrong keys"), timeout=5)
            with pytest.raises(TimeoutError):
                rx.recv(timeout=1.5)
        with MessageSender(peer_ctx, endpoint, linger_ms=0) as good:
            good.send(StageRequest(request_id="q1", stage_id=0, prompt="hi"), timeout=5)
            msg = rx.recv(timeout=10)
        assert isinstance(msg, StageRequest) and msg.request_id == "q1"
        with pytest.raises(TimeoutError):  # the injected messages never arrive, not even late
            rx.recv(timeout=0.5)
        raw.close(linger=0)
        rx.close()
    finally:
        auth.stop()
        for ctx in (server_ctx, peer_ctx, stranger_ctx, plain):
            ctx.destroy(linger=0)


# ---- nothing that runs code from data --------------------------------------------------------
# Calls and imports that turn bytes or strings into code or objects.
FORBIDDEN_MODULES = {"pickle", "cloudpickle", "dill", "marshal", "shelve", "importlib", "runpy", "pydoc"}
FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__"}  # as bare names (re.compile is fine)
FORBIDDEN_CALLS = {"import_module", "import_string", "locate", "resolve_obj_by_qualname", "import_from_path"}
FORBIDDEN_ATTRS = {("yaml", "load"), ("yaml", "unsafe_load"), ("torch", "load"), ("yaml", "full_load")}
# Where bytes and YAML enter: every omni_mp module they import, transitively, is checked.
ENTRY_MODULES = ["omni_mp.wire.messages", "omni_mp.wire.codec", "omni_mp.wire.transport", "omni_mp.config.validate",
                 "omni_mp.client.omni_client", "omni_mp.control.coordinator", "omni_mp.stage.loop",
                 "omni_mp.models.processor", "omni_mp.cli", "omni_mp.wire.keys", "omni_mp"]  # fmt: skip


def _module_file(name: str) -> Path | None:
    base = REPO / Path(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _omni_imports(tree: ast.AST, package: str) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module if node.level == 0 else f"{package.rsplit('.', node.level)[0]}.{node.module}"
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("omni_mp") and _module_file(m) is not None}


def _weights_only(call: ast.Call) -> bool:
    return any(
        k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords
    )


def _violations(tree: ast.AST) -> list[str]:
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad += [f"line {node.lineno}: import {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in FORBIDDEN_CALLS or (isinstance(f, ast.Name) and name in FORBIDDEN_BUILTINS):
                bad.append(f"line {node.lineno}: {name}()")
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            if (owner, name) == ("torch", "load") and _weights_only(node):
                continue  # torch's restricted unpickler: tensors and plain containers, no code
            if (owner, name) in FORBIDDEN_ATTRS:
                bad.append(f"line {node.lineno}: {f.value.id}.{f.attr}()")
    return bad


def test_no_pickle_eval_or_dynamic_import_reachable_from_the_wire_or_yaml() -> None:
    seen: dict[str, list[str]] = {}
    todo = list(ENTRY_MODULES)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        assert path is not None, name
        tree = ast.parse(path.read_text())
        seen[name] = _violations(tree)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        todo += _omni_imports(tree, package + ".x")
    assert "omni_mp.wire.tensor_codec" in seen and "omni_mp.control.links" in seen  # the walk follows imports
    bad = {name: v for name, v in seen.items() if v}
    assert not bad, f"code-from-data constructs reachable from the wire/YAML: {bad}"


def test_the_scan_catches_what_it_looks_for() -> None:
    src = "import pickle\nx = eval('1')\ny = yaml.load(s)\nfrom importlib import import_module\nre.compile('x')\n"
    assert len(_violations(ast.parse(src))) == 4


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['touch " + str(tmp_path / "pwned") + "']\nstages: []\n")
    from omni_mp.config.validate import load_config

    with pytest.raises(ConfigError):
        load_config(evil)
    time.sleep(0.1)
    assert not (tmp_path / "pwned").exists()
    assert INTERNAL  # (the internal identity name is part of the key layout)
