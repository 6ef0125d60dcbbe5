"""Run a pipeline inside the calling process: the coordinator serves on a thread of its own
and the stages are its child processes, as with `omni-mp` in serve mode. For services that
embed omni_mp, benchmarks and check scripts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from omni_mp.config.schema import PipelineConfig
from omni_mp.control.coordinator import Coordinator


@contextmanager
def embedded_pipeline(
    cfg: PipelineConfig, *, log_dir: Path | None = None, progress: Callable[[str], None] | None = None
) -> Iterator[Coordinator]:
    """Start every stage, serve until the block ends, then shut everything down (clients
    connect to `coordinator.client_endpoint`)."""
    coord = Coordinator(cfg, log_dir=log_dir, progress=progress or (lambda msg: None))
    coord.start()
    server = threading.Thread(target=coord.run, name="omni_mp-coordinator", daemon=True)
    server.start()
    try:
        yield coord
    finally:
        coord.stop()
        server.join()
