"""`placement: {kind: ray}`: stages placed on a Ray cluster instead of local subprocesses.

Ray decides where; everything else stays omni_mp's. The coordinator reserves one
placement-group bundle per stage (its GPUs, one CPU, and any custom resources the stage
names: node constraints), then starts in each bundle a `StageProcessActor`. The actor
holds the stage's resources (Ray sets CUDA_VISIBLE_DEVICES for it) and runs the same stage
main loop, `python -m omni_mp.stage`, as its child on that node: the child dies with the
actor (PR_SET_PDEATHSIG), the actor dies with the coordinator (it owns it), and the stage
talks to the coordinator and its peers over ZMQ on TCP with CURVE keys exactly as a local
stage does. Tensors ride as ZMQ frames across hosts (no shared memory over TCP).

To the coordinator's supervisor a Ray stage looks like a local one: `RayStageProcess` has
the `subprocess.Popen` methods it uses (pid, poll, kill, terminate, wait). A dead actor or
node reads as exit code `NODE_LOST`; the restart policy then starts a new actor in the same
bundle, which Ray re-places on another node when its node is gone.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Any

from omni_mp.config.schema import PipelineConfig, StageConfig

log = logging.getLogger("omni_mp.control.ray")

NODE_LOST = -9  # the exit code of a stage whose actor or node is gone
RPC_TIMEOUT_S = 2.0  # a query to a stage's actor; a node that does not answer is lost
NODE_HOST = "{node_ip}"  # in a stage's command: replaced by its actor with the node's address
ACTOR_PID = "{actor_pid}"  # likewise: the actor's pid (the stage dies with its actor)


def _ray() -> Any:
    try:
        import ray
    except ImportError as err:  # the optional extra
        raise RuntimeError("placement 'ray' needs Ray: pip install 'omni_mp[ray]'") from err
    return ray


class StageProcessActor:
    """Runs one stage process on the actor's node (wrapped by `ray.remote` at first use)."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_name: str) -> None:
        from omni_mp.utils.procs import popen

        ray = _ray()
        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        env = dict(env)
        # The GPUs Ray gave this actor (none for a CPU stage); not the coordinator's numbering.
        env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        env["OMNI_MP_NODE"] = f"{self.node_ip} ({self.node_id[:12]})"
        fill = {NODE_HOST: self.node_ip, ACTOR_PID: str(os.getpid())}
        cmd = [_fill(part, fill) for part in cmd]
        log_dir = Path(env.get("OMNI_MP_RAY_LOG_DIR") or "/tmp") / "omni_mp-ray-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / log_name
        with open(self.log_path, "ab") as fh:
            self.proc = popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def info(self) -> dict[str, Any]:
        return {"pid": self.proc.pid, "node_ip": self.node_ip, "node_id": self.node_id}

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def terminate(self, timeout_s: float) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.poll()

    def log_tail(self, n: int) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return "".join(deque(fh, maxlen=n))
        except OSError:
            return "<no log>"


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(key, value)
    return text


class RayStageProcess:
    """The coordinator's view of a stage run by a `StageProcessActor` (Popen-like)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._info_ref = actor.info.remote()  # resolves once the actor has started the stage
        self._info: dict[str, Any] | None = None
        self.returncode: int | None = None

    def _call(self, ref: Any, timeout_s: float = RPC_TIMEOUT_S) -> Any:
        ray = _ray()
        try:
            return ray.get(ref, timeout=timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.NodeDiedError):
            self.returncode = NODE_LOST
            return None

    @property
    def info(self) -> dict[str, Any] | None:
        """pid and node of the stage process, once its actor has started it (never blocks)."""
        if self._info is None and self.returncode is None:
            ray = _ray()
            ready, _ = ray.wait([self._info_ref], timeout=0)
            if ready:
                self._info = self._call(self._info_ref)
        return self._info

    @property
    def pid(self) -> int | None:
        return None if self.info is None else int(self.info["pid"])

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.info is None:  # still being placed or starting: alive as far as we know
            return None
        ray = _ray()
        try:
            code = ray.get(self.actor.poll.remote(), timeout=RPC_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            return None  # slow to answer: the heartbeat timeout decides whether it hangs
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.NodeDiedError):
            code = NODE_LOST
        self.returncode = code
        return code

    def kill(self) -> None:
        ray = _ray()
        try:
            ray.get(self.actor.kill.remote(), timeout=RPC_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - whatever state it is in, the actor goes next
            log.warning("stage actor did not answer a kill; removing the actor")
        ray.kill(self.actor, no_restart=True)
        self.returncode = self.returncode if self.returncode is not None else NODE_LOST

    def terminate(self) -> None:
        ray = _ray()
        try:
            self.returncode = ray.get(self.actor.terminate.remote(10.0), timeout=15.0)
        except Exception:  # noqa: BLE001
            self.kill()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("ray stage", timeout or 0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def log_tail(self, n: int) -> str:
        tail = self._call(self.actor.log_tail.remote(n)) if self.returncode != NODE_LOST else None
        return tail if tail is not None else "<the stage's node or actor is gone: no log>"


def bundle(stage: StageConfig) -> dict[str, float]:
    """What a stage reserves: its GPUs, one CPU, and its custom resources (node constraints)."""
    res: dict[str, float] = {"CPU": 1.0, **stage.ray_resources}
    if stage.devices:
        res["GPU"] = float(len(stage.devices))
    return res


class RayPlacement:
    """One pipeline's reservation on a Ray cluster: a placement group, a bundle per stage."""

    def __init__(self, cfg: PipelineConfig, run_id: str) -> None:
        ray = _ray()
        from ray.util.placement_group import placement_group

        self.cfg = cfg
        self.run_id = run_id
        p = cfg.placement
        self._own_connection = not ray.is_initialized()
        if self._own_connection:
            ray.init(address=p.address, namespace=p.namespace, log_to_driver=False, logging_level=logging.WARNING)
        processes = cfg.replica_stages()  # one bundle per replica of each stage
        self.index = {(s.id, r): i for i, (r, s) in enumerate(processes)}
        self.group = placement_group([bundle(s) for _, s in processes], strategy=p.strategy, name=f"{run_id}-stages")
        self._actor_cls = ray.remote(StageProcessActor)
        self.actors: dict[tuple[int, int], Any] = {}

    def wait_placed(self, timeout_s: float) -> None:
        ray = _ray()
        if not ray.get(self.group.ready(), timeout=timeout_s):
            raise TimeoutError(
                f"placement group for {len(self.index)} stage process(es) not placed in {timeout_s:.0f}s"
            )

    def launch(
        self, stage: StageConfig, cmd: list[str], env: dict[str, str], log_name: str, replica: int = 0
    ) -> RayStageProcess:
        """Start a replica of the stage in its bundle (asynchronously: Ray places the actor)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        key = (stage.id, replica)
        old = self.actors.pop(key, None)
        if old is not None:
            _ray().kill(old, no_restart=True)
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.index[key]
        )
        actor = self._actor_cls.options(  # holds its bundle's CPU and GPUs
            num_cpus=1,
            num_gpus=len(stage.devices),
            scheduling_strategy=strategy,
            name=f"{self.run_id}-stage{stage.id}.{replica}",
            namespace=self.cfg.placement.namespace,
        ).remote(cmd, env, log_name)
        self.actors[key] = actor
        return RayStageProcess(actor)

    def close(self) -> None:
        ray = _ray()
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors.values():
            ray.kill(actor, no_restart=True)
        self.actors.clear()
        try:
            remove_placement_group(self.group)
        except Exception:  # noqa: BLE001 - the cluster may be gone already
            log.warning("could not remove the placement group")
        if self._own_connection:
            ray.shutdown()
