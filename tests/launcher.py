"""How tests run things: `python -m omni_mp.launch` as a real subprocess (checking it leaves
nothing behind), and an AR engine in the test process as a stage process runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from omni_mp.models.registry import resolve_model

REPO = Path(__file__).resolve().parent.parent


class ServedPipeline:
    def __init__(self, proc: subprocess.Popen[str], endpoint: str, lines: list[str]) -> None:
        self.proc = proc
        self.endpoint = endpoint
        self.lines = lines  # stdout+stderr of the launcher, collected by a thread

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


def _pump(stream: object, lines: list[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line)


@contextmanager
def serve(config: Path, *extra: str, startup_timeout_s: float = 600) -> Iterator[ServedPipeline]:
    """Run the launcher in serve mode; on exit SIGINT it and require a clean, leak-free exit."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_mp.launch", "--config", str(config), *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + startup_timeout_s
    endpoint = None
    while endpoint is None:
        for line in list(lines):
            m = re.search(r"serving pipeline .* on (\S+)", line)
            if m:
                endpoint = m.group(1)
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("launcher did not start:\n" + "".join(lines[-40:]))
        time.sleep(0.1)
    served = ServedPipeline(proc, endpoint, lines)
    try:
        yield served
    finally:
        if proc.poll() is None:
            children = served.descendants()
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _, alive = psutil.wait_procs(children, timeout=10)
            for p in alive:
                p.kill()
            assert not alive, f"stage processes outlived the launcher: {alive}\n" + "".join(lines[-40:])


def abstract_sockets_of(pattern: str) -> list[str]:
    """Linux abstract unix sockets whose name contains `pattern` (they show in /proc/net/unix with '@')."""
    with open("/proc/net/unix") as fh:
        return [line.split()[-1] for line in fh if "@" in line and pattern in line]


def sockets_left(pattern: str, timeout_s: float = 5.0) -> list[str]:
    """`abstract_sockets_of(pattern)` once they are gone or `timeout_s` has passed (the kernel
    drops a dead process's sockets shortly after it exits)."""
    deadline = time.monotonic() + timeout_s
    while (left := abstract_sockets_of(pattern)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@contextmanager
def in_process_engine(model: str, engine_args: dict[str, Any], features: Any) -> Iterator[Any]:
    """An AREngine in this process, as a stage process runs it: vLLM's worker in-process too."""
    from omni_mp.engines.ar import AREngine

    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    eng = AREngine(resolve_model(model), engine_args, features)
    try:
        yield eng
    finally:
        eng.shutdown()
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether process `pid` has exited (or is a zombie) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@contextmanager
def settled_client(endpoint: str, timeout_s: float = 5.0) -> Iterator[object]:
    """An OmniClient for a test; afterwards nothing may stay in flight, whatever the test did."""
    from omni_mp.client.omni_client import OmniClient

    with OmniClient(endpoint) as client:
        yield client
        deadline = time.monotonic() + timeout_s
        while client.status().inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.status().inflight == 0


def start_request(engine: Any, request_id: str, sampling: Any, speaker: str | None = None, **stage_input: Any) -> Any:
    """Prepare and add a request as the stage loop does (both halves on this thread)."""
    from omni_mp.engines.base import StageInput

    return engine.add(engine.prepare(request_id, sampling, StageInput(**stage_input), speaker))


def engine_is_empty(engine: Any) -> bool:
    """No request left in the engine's vLLM scheduler."""
    return not engine.driver.core.scheduler.has_requests()


def wait_healthy(url: str, pipeline: ServedPipeline, timeout_s: float = 300) -> None:
    """Wait until the HTTP server at `url` answers /health with 200; the pipeline's last lines
    if it does not within `timeout_s`."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the HTTP server did not come up:\n" + "".join(pipeline.lines[-40:])
        time.sleep(0.5)


def with_replicas(config: Path, directory: Path, replicas: dict[int, int]) -> Path:
    """A copy of a pipeline YAML in `directory` with `replicas` set on stages (by position)."""
    import yaml

    data = yaml.safe_load(config.read_text())
    for index, n in replicas.items():
        data["stages"][index]["replicas"] = n
    out = directory / f"{config.stem}-replicas.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def run_cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`python -m omni_mp.launch ARGS` run from `cwd` (a test's temp dir: outside the checkout,
    so a shipped config is found by name, as package data), checking it left no process behind."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cmd = [sys.executable, "-m", "omni_mp.launch", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"processes left behind: {left}"
    return proc


def config_args(name: str) -> list[str]:
    """The launcher's arguments for shipped config `name`: none for the demo's default."""
    from omni_mp.stage_configs import DEFAULT

    return [] if name == DEFAULT else ["--config", name]


def check_shipped_run(name: str, proc: subprocess.CompletedProcess[str], out: Path, requests: int = 1) -> None:
    """What every run of a shipped config through the CLI must end with (tests/test_shipped_configs.py):
    every request served, each output written (.json always, .wav for a final stage that
    speaks, .png for one that draws), and no record with an error."""
    from omni_mp.config.validate import load_config
    from omni_mp.models.registry import makes_images
    from omni_mp.stage_configs import shipped_config

    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert f"{requests}/{requests} requests succeeded" in proc.stdout + proc.stderr, tail
    cfg = load_config(shipped_config(name), check_engine_args=False)
    want = {".json"}
    for s in cfg.final_stages:
        if s.kind == "diffusion":
            want.add(".png" if makes_images(s.diffusion.model_type) else ".wav")
    written = {p.suffix for p in out.iterdir()}
    assert want <= written, (sorted(written), tail)
    for record in out.glob("*.json"):
        assert json.loads(record.read_text()).get("error") is None, record
