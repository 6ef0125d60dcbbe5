"""Stages that share a GPU, run under NVIDIA's Multi-Process Service (`gpu_sharing` in the
pipeline YAML, config.GpuSharingConfig): which stages, whose MPS daemon, and the life of the
daemon omni_mp starts for them.

Why: processes on one GPU time-slice it, so each stage's step also waits out the other stages'
steps, even when no stage fills the GPU. Measured on one H200 (docs/benchmarks/journal.md), time-sliced
-> MPS: Qwen3-Omni's three stages, code2wav's step at 32 requests 36 -> 15 ms p50 and the
pipeline's real-time factor 0.400 -> 0.329; Qwen2.5-Omni's at one request 0.450 -> 0.347.

The daemon (`nvidia-cuda-mps-control -f`, in a private pipe directory, so it neither needs nor
touches a host-wide one) is owned by a guard process (omni_mp.control.mps_guard) that the
coordinator holds by a pipe: when the coordinator shuts down or dies, even SIGKILLed, the pipe
closes and the guard quits the daemon and removes the directory. The guard is not killed with
the coordinator, or nothing would be left to do that.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omni_mp.config.schema import PipelineConfig
from omni_mp.utils.procs import popen

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
CONTROL_ENV = "OMNI_MP_MPS_CONTROL"  # the control program's path; default: CONTROL found on PATH
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"  # where clients find their daemon
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
PRIORITY_ENV = "CUDA_MPS_CLIENT_PRIORITY"  # a client's priority: 0 normal, 1 below normal
SM_PERCENT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"  # a client's share of the SMs, in percent
PRIORITY_LEVELS = {"normal": "0", "below_normal": "1"}
SYSTEM_PIPE = "/tmp/nvidia-mps"  # a daemon started without PIPE_ENV listens here; clients try it by default
READY_LINE = "ready"
PID_FILE = "nvidia-cuda-mps-control.pid"  # the control daemon writes its pid there, in its pipe directory
_LINE_MAX = 4096  # the guard's one line (ready, or why not)
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; the daemon's sockets sit inside its pipe directory


class MpsUnavailable(RuntimeError):
    """No MPS daemon could be started; the message says why."""


@dataclass(frozen=True, slots=True)
class SharingPlan:
    """How the pipeline's stages share their GPUs."""

    stages: frozenset[int]  # stage ids to run as MPS clients (every stage on a shared GPU)
    gpus: tuple[int, ...]  # GPUs that two or more stages use
    host_pipe: str | None  # the pipe directory of an MPS daemon already serving this host
    why: str  # for the log: why no MPS, or which stages share which GPU

    @property
    def needs_daemon(self) -> bool:
        return bool(self.stages) and self.host_pipe is None


def shared_gpus(cfg: PipelineConfig) -> dict[int, list[int]]:
    """GPU id -> the ids of the stages pinned to it, for GPUs that two or more stages use."""
    users: dict[int, list[int]] = {}
    for _, s in cfg.replica_stages():  # replicas of one stage on one GPU share it too
        for gpu in s.devices:
            users.setdefault(gpu, []).append(s.id)
    return {gpu: ids for gpu, ids in sorted(users.items()) if len(ids) > 1}


def host_daemon_pipe(env: Mapping[str, str]) -> str | None:
    """The pipe directory of an MPS daemon this host already runs for these processes: the
    one the environment names, or the default one if its control socket exists."""
    if env.get(PIPE_ENV):
        return env[PIPE_ENV]
    return SYSTEM_PIPE if (Path(SYSTEM_PIPE) / "control").exists() else None


def plan_sharing(cfg: PipelineConfig, env: Mapping[str, str] | None = None) -> SharingPlan:
    env = os.environ if env is None else env
    none = frozenset[int]()
    if cfg.gpu_sharing.mode == "time_slice":
        return SharingPlan(none, (), None, "gpu_sharing: time_slice")
    if cfg.placement.kind == "ray":  # config.validate refuses mode `mps` with ray
        return SharingPlan(none, (), None, "placement ray: MPS is the hosts' own to run")
    shared = shared_gpus(cfg)
    if not shared:
        return SharingPlan(none, (), None, "no GPU is shared by two stages")
    stages = frozenset(sid for ids in shared.values() for sid in ids)
    on = "; ".join(f"GPU {gpu}: stages {', '.join(map(str, ids))}" for gpu, ids in shared.items())
    low = sorted(s.id for s in cfg.stages if s.id in stages and s.mps_priority == "below_normal")
    if low:
        on += f"; below normal priority: stage{'s' if len(low) > 1 else ''} {', '.join(map(str, low))}"
    capped = [f"stage {s.id} {s.mps_sm_percent}%" for s in cfg.stages if s.id in stages and s.mps_sm_percent]
    if capped:
        on += f"; SM shares: {', '.join(capped)}"
    return SharingPlan(stages, tuple(shared), host_daemon_pipe(env), on)


def control_program(env: Mapping[str, str] | None = None) -> str:
    """The MPS control program to run (MpsUnavailable if there is none)."""
    env = os.environ if env is None else env
    path = env.get(CONTROL_ENV) or shutil.which(CONTROL, path=env.get("PATH"))
    if not path:
        raise MpsUnavailable(f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)")
    return path


def send_quit(control: str, env: Mapping[str, str], timeout_s: float) -> str | None:
    """Ask the daemon whose pipe directory `env` names to quit (its servers, then itself);
    why that could not be asked, or None."""
    try:
        subprocess.run([control], input=b"quit\n", env=dict(env), timeout=timeout_s, capture_output=True)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"quit failed: {err}"
    return None


class MpsDaemon:
    """A private MPS control daemon for one pipeline run, through its guard process."""

    def __init__(self, guard: subprocess.Popen[bytes], root: Path, control: str) -> None:
        self.guard = guard
        self.root = root
        self.control = control

    @property
    def pipe(self) -> str:
        """The value of CUDA_MPS_PIPE_DIRECTORY for its clients."""
        return str(self.root / "pipe")

    @classmethod
    def start(cls, log_path: Path, timeout_s: float = 30.0) -> MpsDaemon:
        """Start the guard and its daemon; return once the daemon takes clients."""
        control = control_program()
        root = Path(tempfile.mkdtemp(prefix="omni-mps-"))
        if len(str(root / "pipe" / "control")) > _SOCKET_PATH_MAX:
            shutil.rmtree(root, ignore_errors=True)
            raise MpsUnavailable(f"{root}: too long a path for the daemon's sockets (set TMPDIR to a shorter one)")
        cmd = [sys.executable, "-m", "omni_mp.control.mps_guard", "--root", str(root), "--control", control]
        with open(log_path, "ab") as log_file:
            guard = popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file)
        assert guard.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = b""
        while not line.endswith(b"\n") and len(line) < _LINE_MAX and time.monotonic() < deadline:
            if select.select([guard.stdout], [], [], 0.1)[0]:
                chunk = os.read(guard.stdout.fileno(), 4096)
                if not chunk:  # the guard ended
                    break
                line += chunk
        daemon = cls(guard, root, control)
        if line.strip().decode(errors="replace") != READY_LINE:
            daemon.stop()
            said = line.strip().decode(errors="replace") or f"nothing within {timeout_s:.0f}s"
            raise MpsUnavailable(f"{control} did not start: {said} (guard log: {log_path})")
        return daemon

    def alive(self) -> bool:
        return self.guard.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """Quit the daemon (the guard does, once its pipe closes) and wait for the guard."""
        if self.guard.stdin is not None and not self.guard.stdin.closed:
            self.guard.stdin.close()
        try:
            self.guard.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("MPS guard %d did not end within %.0fs; killing it", self.guard.pid, timeout_s)
            self.guard.kill()
            self.guard.wait(timeout_s)
        if self.guard.returncode is None or self.guard.returncode < 0:  # killed: it quit nothing
            self._quit_daemon(timeout_s)
        if self.guard.stdout is not None:
            self.guard.stdout.close()
        shutil.rmtree(self.root, ignore_errors=True)  # the guard's job; again in case it was killed

    def _quit_daemon(self, timeout_s: float) -> None:
        """Quit the daemon without its guard: it runs in a session of its own (out of reach of
        a terminal's Ctrl-C), so the guard's death does not end it. Waits for it to exit (its
        pid file, which the daemon writes in its pipe directory), killing it after `timeout_s`."""
        try:
            pid = int((Path(self.pipe) / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            pid = None
        failed = send_quit(self.control, {**os.environ, PIPE_ENV: self.pipe}, timeout_s)
        if failed is not None:
            log.warning("MPS daemon at %s: %s", self.pipe, failed)
        deadline = time.monotonic() + timeout_s
        while pid is not None and _alive(pid):
            if time.monotonic() > deadline:
                log.warning("MPS daemon %d did not quit within %.0fs; killing it", pid, timeout_s)
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process now has the pid: ours is gone
        return False
    return True
