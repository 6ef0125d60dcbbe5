"""Entry point of a stage process: `python -m omni_mp.stage` (spawned by the coordinator).

The coordinator sets the environment (CUDA_VISIBLE_DEVICES, vLLM CPU settings) before this
interpreter starts, and passes the pipeline config as JSON in OMNI_MP_PIPELINE_CONFIG.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_mp.config.schema import StageConfig
    from omni_mp.engines.base import StageEngine
    from omni_mp.stage.loop import StageLoop


def device_info() -> dict[str, str]:
    """What this process sees of the GPUs: shown by status, so pinning can be checked from outside."""
    import torch

    info = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")}
    info["node"] = os.environ.get("OMNI_MP_NODE", "local")  # placement ray: the node's address and id
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        info["torch_cuda_device_count"] = str(n)
        info["torch_cuda_devices"] = "; ".join(torch.cuda.get_device_name(i) for i in range(n))
        info["torch_cuda_current_device"] = str(torch.cuda.current_device())
        # SMs this process may use: fewer than the GPU has under an MPS share (mps_sm_percent)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["torch_cuda_sms"] = str(props.multi_processor_count)
    else:
        info["torch_cuda_device_count"] = "0"
    return info


def build_engine(stage: StageConfig) -> StageEngine:
    """The stage's engine: diffusion, or AR with what its processor and config need (a
    `model_part` is a vLLM model of ours, registered by its family: omni_mp.models.registry)."""
    from omni_mp.engines.ar import AREngine, EngineFeatures
    from omni_mp.models.registry import engine_model, prompt_format, resolve_model, stage_processor

    processor = stage_processor(stage.processor) if stage.processor else None
    if stage.kind == "diffusion":
        from omni_mp.engines.diffusion.engine import DiffusionEngine

        open_inputs = processor is not None and processor.streams_inputs
        return DiffusionEngine(resolve_model(stage.model), stage.diffusion, stage.engine_args, open_inputs=open_inputs)
    # An entry stage whose prompt format builds embeddings (a TTS talker) takes them, and a row each step.
    embeds = stage.prompt_format is not None and bool(
        getattr(prompt_format(stage.prompt_format), "embeds_prompt", False)
    )
    features = EngineFeatures(
        hidden_states=stage.hidden_states is not None,
        hidden_layers=tuple(stage.hidden_states.layers) if stage.hidden_states is not None else (),
        prompt_embeds=stage.prompt_embeds or embeds or (processor is not None and processor.prompt_embeds_enabled),
        step_embeds=embeds or (processor is not None and processor.step_embeds_enabled),
        warm_moe_kernels=stage.warm_moe_kernels,
    )
    built = engine_model(stage.model_part, resolve_model(stage.model), stage.engine_args)
    return AREngine(built.model, built.engine_args, features)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="omni_mp.stage")
    parser.add_argument("--stage-id", type=int, required=True)
    parser.add_argument("--events", required=True, help="coordinator endpoint for events")
    parser.add_argument("--input", required=True, help="endpoint this stage binds for its input")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--replica", type=int, default=0, help="which replica of the stage (its devices)")
    return parser.parse_args(argv)


def _label(args: argparse.Namespace) -> str:
    """The stage's id in log lines, with its replica's when it has several (`1.2`)."""
    return f"{args.stage_id}.{args.replica}" if args.replica else str(args.stage_id)


def _settle_process(args: argparse.Namespace) -> None:
    """Die with the parent, pin the cores the coordinator chose, log with the stage's id."""
    from omni_mp.utils.procs import die_with_parent

    die_with_parent(args.parent_pid)
    cores = os.environ.get("OMNI_MP_CPU_CORES")
    if cores and hasattr(os, "sched_setaffinity"):
        from omni_mp.config.schema import parse_core_list

        os.sched_setaffinity(0, parse_core_list(cores))
    logging.basicConfig(
        level=os.environ.get("OMNI_MP_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s stage{_label(args)} %(levelname)s %(name)s: %(message)s",
    )


def _start_engine(stage: StageConfig, t0: float) -> tuple[StageEngine, str | None]:
    """The stage's engine and the note on its GPU memory (MemoryBudgetError over its budget)."""
    import torch

    from omni_mp.stage.memory_check import cap_gpu_memory, check_gpu_memory, out_of_budget
    from omni_mp.stage.torch_profile import enable_vllm_scopes

    log = logging.getLogger("omni_mp.stage")
    enable_vllm_scopes(stage.id)  # before the engine is built: vLLM reads it once
    log.info("stage %d: starting %s engine for %s", stage.id, stage.kind, stage.model)
    cap = cap_gpu_memory(stage)  # before the engine allocates anything
    try:
        engine = build_engine(stage)
    except torch.OutOfMemoryError as err:
        if cap is None:
            raise
        raise out_of_budget(stage, err) from err
    log.info("stage %d: engine ready in %.1fs", stage.id, time.monotonic() - t0)
    memory = check_gpu_memory(stage)  # over its budget: refuse to serve (MemoryBudgetError)
    if memory and cap:
        memory = f"{memory}, {cap}"
    return engine, memory


def _ready_info(
    stage: StageConfig, loop: StageLoop, engine: StageEngine, endpoint: str, t0: float, memory: str | None
) -> dict:
    """What the Ready event tells the coordinator (it prints it with the stage's Ready line)."""
    info = {"input": endpoint, "init_s": f"{time.monotonic() - t0:.2f}", **device_info()}
    if stage.mps_sm_percent is not None:
        info["mps_share"] = f"MPS share {stage.mps_sm_percent}%: {info.get('torch_cuda_sms', '?')} SMs usable"
    if loop.speakers:  # the voices a request may pick here (the HTTP server lists them)
        info["speakers"] = ",".join(sorted(loop.speakers))
    warmup = getattr(engine, "warmup_note", None)
    if warmup:
        info["warmup"] = warmup
    if memory:
        info["gpu_memory"] = memory
    return info


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _settle_process(args)
    log = logging.getLogger("omni_mp.stage")

    import zmq

    from omni_mp.config.schema import config_from_json
    from omni_mp.stage.io_threads import Heartbeater
    from omni_mp.wire.keys import STAGE_DOMAIN, SecureContext, pipeline_identity
    from omni_mp.wire.messages import Ready
    from omni_mp.wire.transport import CONTROL_HWM, MessageReceiver, MessageSender

    cfg = config_from_json(os.environ["OMNI_MP_PIPELINE_CONFIG"])
    stage = cfg.stage(args.stage_id).replica(args.replica)  # this replica's devices
    ctx = SecureContext()
    auth = None
    if cfg.security.keys is not None:  # CURVE on every socket: binds serve, connects authenticate
        ctx.curve = pipeline_identity(cfg.security.keys)
        auth = ctx.curve.start_authenticator(ctx, (STAGE_DOMAIN,))
    events = MessageSender(ctx, args.events, cfg.limits, hwm=CONTROL_HWM)
    heartbeats = MessageSender(ctx, args.events, cfg.limits, hwm=CONTROL_HWM)  # its own socket: never behind data
    input_link = MessageReceiver(ctx, args.input, cfg.limits, hwm=CONTROL_HWM)
    endpoint = input_link.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    loop: StageLoop | None = None

    def on_term(signum: int, frame: object) -> None:
        if loop is not None:
            loop.running = False
        else:
            sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)

    @contextlib.contextmanager
    def beating() -> Iterator[None]:
        # Beat while the engine loads: a stage that hangs or is stopped during start-up is noticed
        # within heartbeat_timeout_s (the loop's own heartbeater takes over the socket after).
        starting = threading.Event()
        interval = cfg.timeouts.heartbeat_interval_s
        beat = Heartbeater(heartbeats, stage.id, interval, math.inf, time.monotonic, starting, replica=args.replica)
        beat.start()
        try:
            yield
        finally:
            starting.set()
            beat.join()

    with beating():
        from omni_mp.stage.loop import StageLoop

        t0 = time.monotonic()
        engine, memory = _start_engine(stage, t0)
    loop = StageLoop(cfg, stage, engine, ctx, input_link, events, heartbeats, args.replica)
    info = _ready_info(stage, loop, engine, endpoint, t0, memory)
    events.send(Ready(stage_id=stage.id, pid=os.getpid(), info=info, replica=args.replica), timeout=60)
    try:
        loop.run()
    finally:
        # No engine.shutdown(): vLLM's in-process teardown frees memory for a process that goes
        # on (1.8 s for the tiny thinker on CPU); this one ends below and the OS frees it all.
        for link in [input_link, heartbeats, events]:
            link.close()  # senders linger briefly so the last events reach their peer
        if auth is not None:
            auth.stop()
        ctx.term()
    log.info("stage %d: exited cleanly", stage.id)
    return 0


if __name__ == "__main__":
    from omni_mp.utils.procs import exit_now

    exit_now(main())
