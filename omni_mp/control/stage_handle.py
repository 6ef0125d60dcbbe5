"""The coordinator's handle on one stage process: spawn with its own environment, watch, kill."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from omni_mp.config.schema import PipelineConfig, StageConfig, config_to_json, parse_core_list
from omni_mp.control.endpoints import RunEndpoints
from omni_mp.control.mps import PIPE_ENV, PRIORITY_ENV, PRIORITY_LEVELS, SM_PERCENT_ENV
from omni_mp.control.ray_placement import ACTOR_PID, NODE_HOST, RayPlacement, RayStageProcess
from omni_mp.utils.devices import VISIBLE_ENV, visible_entries
from omni_mp.utils.procs import popen
from omni_mp.wire.messages import StageStats


def stage_env(
    cfg: PipelineConfig,
    stage: StageConfig,
    base: dict[str, str] | None = None,
    mps_pipe: str | None = None,
    replica: int = 0,
) -> dict[str, str]:
    """The environment a stage process starts with; device pinning must precede its first import.
    `stage`: the replica's own view (StageConfig.replica). `mps_pipe`: the MPS daemon it is a
    client of (omni_mp.control.mps); None: none of ours."""
    env = dict(os.environ if base is None else base)
    if mps_pipe is not None:
        env[PIPE_ENV] = mps_pipe
    elif cfg.gpu_sharing.mode == "time_slice":
        env.pop(PIPE_ENV, None)  # not a client of a daemon the environment names
    env["OMNI_MP_PIPELINE_CONFIG"] = config_to_json(cfg).decode()
    # Keep the vLLM worker in the stage process (UniProcExecutor): no engine/worker children.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if stage.devices:
        # Indices into the caller's visible GPUs (omni_mp.utils.devices), as vLLM and torch read
        # them. On Ray the stage's actor sets the GPUs Ray gave it instead (the node's, not ours).
        local = cfg.placement.kind == "local"
        entries = visible_entries(stage.devices, env, f"stage {stage.id}") if local else map(str, stage.devices)
        env[VISIBLE_ENV] = ",".join(entries)
        env[PRIORITY_ENV] = PRIORITY_LEVELS[stage.mps_priority]  # read by CUDA at init, as an MPS client
        if stage.mps_sm_percent is not None:
            env[SM_PERCENT_ENV] = str(stage.mps_sm_percent)
        else:
            env.pop(SM_PERCENT_ENV, None)  # a share meant for another program is not this stage's
        # torch's intra-op threads default to every core, in each stage: with several stages
        # on a host their host-side work (prefills, input handling) fights for the cores. Each
        # gets an equal share, one share kept for the coordinator and its client; a value the
        # user set is kept. Measured: three Qwen3-Omni stages on one H200 host of 16 cores,
        # first audio 336 -> 275 ms at 1 request and 1469 -> 745 ms at 8 (docs/benchmarks/journal.md).
        env.setdefault("OMP_NUM_THREADS", str(gpu_stage_threads(sum(s.replicas for s in cfg.stages))))
    else:
        # CPU stage: its own KV cache budget and its own cores (by default one core per stage,
        # round-robin), so several engines on one host neither take all RAM nor share cores.
        env[VISIBLE_ENV] = ""
        env["VLLM_CPU_KVCACHE_SPACE"] = str(stage.cpu_kv_cache_gib)
        if stage.cpu_cores is not None:
            cores = stage.cpu_cores
        else:
            ncpu = os.cpu_count() or 1
            processes = [(s.id, r) for r, s in cfg.replica_stages()]
            cores = str(processes.index((stage.id, replica)) % ncpu)
        # The stage pins itself to these cores (sched_setaffinity) before vLLM starts: the
        # in-process executor does not apply VLLM_CPU_OMP_THREADS_BIND (only vLLM's mp one does).
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
        env["OMNI_MP_CPU_CORES"] = cores
        env["OMP_NUM_THREADS"] = str(len(parse_core_list(cores)))
        if stage.kind == "ar" and stage.engine_args.get("enforce_eager"):
            # An eager vLLM 0.25.0 CPU engine compiles one thing with inductor: its sampler's
            # `compiled_random_sample`, at the start-up warm-up. Inductor first probes every SIMD
            # ISA the CPU flags name (each a build loaded by a fresh `python -c "import torch"`):
            # most of such a stage's start on 2 cores (`scripts/demo.sh`, three stages: 49 s ->
            # 27 s without the probe). Without it that one kernel is scalar C++, the same sums.
            # A compiled (non-eager) engine keeps the probe: its model runs inductor's code.
            env.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
    return env


def gpu_stage_threads(num_stages: int, cores: int | None = None) -> int:
    """Intra-op CPU threads for each GPU stage process of a pipeline of `num_stages` on a host
    of `cores` (default: this one's): an equal share of the cores, one share for the coordinator."""
    return max(1, (cores or os.cpu_count() or 1) // (num_stages + 1))


def exiting_code(pid: int) -> int | None:
    """The exit status of a process whose main thread has exited while the kernel still tears
    the rest down (it cannot be reaped yet, but it will never serve again): Linux shows its
    thread-group leader as a zombie, with the status in /proc/PID/stat. None otherwise."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[49])  # field 52 of stat: the waitpid status
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


StageProcess = subprocess.Popen[bytes] | RayStageProcess


@dataclass(eq=False)
class Incarnation:
    """One run of a stage process, from spawn to death: everything the coordinator knows of
    it. Only its StageHandle changes it; a restart is a new object, so nothing of a dead run
    (its address, links, info) can be mistaken for the next one's."""

    proc: StageProcess
    spawned_at: float
    last_heartbeat: float
    beating: bool = False  # it has sent a heartbeat (it may, before it is ready)
    endpoint: str | None = None  # the input address from its Ready; None until it is ready
    info: dict[str, str] = field(default_factory=dict)  # from its Ready: init time, devices it sees
    # Downstream replica (stage, replica) -> the run of it whose address this one acknowledged linking to.
    links: dict[tuple[int, int], Incarnation] = field(default_factory=dict)
    stats: StageStats | None = None  # from its latest heartbeat that carried them

    @property
    def ready(self) -> bool:
        """Its engine is up: it has reported the address it bound."""
        return self.endpoint is not None


class StageHandle:
    """One stage across its runs: spawn, watch, kill; the only writer of its Incarnation."""

    def __init__(
        self,
        cfg: PipelineConfig,
        stage: StageConfig,
        events_endpoint: str,
        endpoints: RunEndpoints,
        log_dir: Path,
        ray: RayPlacement | None = None,
        replica: int = 0,
    ):
        self.cfg = cfg
        self.replica = replica
        self.stage = stage.replica(replica)  # its own devices and Ray resources
        self.events_endpoint = events_endpoint
        self.endpoints = endpoints
        # A stage of one replica keeps the plain names (its log, its messages).
        self.name = f"stage {stage.id}" if stage.replicas == 1 else f"stage {stage.id} replica {replica}"
        self.log_path = log_dir / (f"stage{stage.id}.log" if stage.replicas == 1 else f"stage{stage.id}.{replica}.log")
        self.ray = ray  # placement ray: the stage runs in a Ray actor on some node
        self.run: Incarnation | None = None  # None: not started, dead, or failed for good
        self.restarts = 0
        self.restart_at: float | None = None  # dead, and due to be restarted then (monotonic)
        self.failure: str | None = None  # down for good (no restart left): why it last died
        self.mps_pipe: str | None = None  # its runs are clients of this MPS daemon (omni_mp.control.mps)

    @property
    def proc(self) -> StageProcess | None:
        return None if self.run is None else self.run.proc

    @property
    def pid(self) -> int | None:
        return None if self.run is None else self.run.proc.pid

    @property
    def ready(self) -> bool:
        return self.run is not None and self.run.ready

    def _command(self, input_endpoint: str, parent_pid: str) -> list[str]:
        # Ray: the same interpreter path on every node (one venv layout).
        return [sys.executable, "-m", "omni_mp.stage", "--stage-id", str(self.stage.id)] + [
            "--events", self.events_endpoint, "--input", input_endpoint, "--parent-pid", parent_pid,
            "--replica", str(self.replica),
        ]  # fmt: skip

    def spawn(self) -> None:
        self.failure = None
        proc = self._launch()
        now = time.monotonic()
        self.run = Incarnation(proc=proc, spawned_at=now, last_heartbeat=now)

    def _launch(self) -> StageProcess:
        if self.ray is not None:
            # The node Ray places it on binds its input; it dies with the actor that runs it.
            cmd = self._command(f"tcp://{NODE_HOST}:*", ACTOR_PID)
            name = f"{self.endpoints.run_id}-stage{self.stage.id}.{self.replica}-{self.restarts}.log"
            env = stage_env(self.cfg, self.stage, replica=self.replica)
            return self.ray.launch(self.stage, cmd, env, name, self.replica)
        # A fresh ipc name per incarnation: nothing addressed to a dead one reaches this one.
        cmd = self._command(self.endpoints.stage_input(self.stage.id, self.restarts, self.replica), str(os.getpid()))
        with open(self.log_path, "ab") as log:
            log.write(f"==== spawn {time.strftime('%H:%M:%S')} (restart {self.restarts}) ====\n".encode())
            log.flush()
            return popen(
                cmd,
                env=stage_env(self.cfg, self.stage, mps_pipe=self.mps_pipe, replica=self.replica),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def restart(self) -> None:
        self.restart_at = None
        self.restarts += 1
        self.spawn()

    def died(self, restart_at: float | None, reason: str = "it died") -> None:
        """The current run is over; restart at `restart_at` (None: never, it is down for good)."""
        self.run = None
        self.restart_at = restart_at
        self.failure = reason if restart_at is None else None

    def heartbeat(self, now: float, stats: StageStats | None = None) -> None:
        if self.run is not None:
            self.run.last_heartbeat = now
            self.run.beating = True
            if stats is not None:
                self.run.stats = stats

    def became_ready(self, endpoint: str, info: dict[str, str], now: float) -> None:
        """The current run reports its engine up, its input bound at `endpoint`."""
        if self.run is not None:
            self.run.endpoint, self.run.info, self.run.last_heartbeat = endpoint, info, now

    def linked(self, key: tuple[int, int], downstream: Incarnation) -> None:
        """The current run acknowledged its link to `downstream`, a run of replica `key` (stage, replica)."""
        if self.run is not None:
            self.run.links[key] = downstream

    def exit_code(self) -> int | None:
        """None while running (or never spawned); the exit code once it has exited, also
        while the kernel still tears it down (see exiting_code)."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is not None or isinstance(self.proc, RayStageProcess):  # its pid is on another host
            return code
        return exiting_code(self.proc.pid)

    def is_alive(self) -> bool:
        return self.exit_code() is None and self.proc is not None

    def kill(self) -> None:
        """SIGKILL, without waiting: a killed process can take the kernel many seconds to tear
        down (a thread in uninterruptible sleep), and the caller is the coordinator's loop.
        (subprocess reaps a dropped Popen later.)"""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def terminate(self, timeout_s: float) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`; waits at most 2 x `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        if not self.wait(timeout_s):
            self.kill()
            self.wait(timeout_s)

    def wait(self, timeout_s: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def last_log_lines(self, n: int = 20) -> str:
        if isinstance(self.proc, RayStageProcess):
            return self.proc.log_tail(n)
        try:
            with open(self.log_path, errors="replace") as fh:
                return "".join(deque(fh, maxlen=n))
        except OSError:
            return "<no log>"
