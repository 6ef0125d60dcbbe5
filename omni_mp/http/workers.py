"""The server as processes: `build_app` makes one server's app (the same for one process or
several), `run_workers` runs `http.workers` of them on one listening socket.

Several workers are uvicorn's (`workers=N`: a supervisor process that restarts a worker that
dies, each worker a process of its own spawned fresh). They share one private directory
(mode 0700; removed when the server stops, and by the launcher
that started it however it stopped) that holds the audio-id store every worker opens
(omni_mp.http.audio_ids_sqlite, one tag for all) and Prometheus' multiprocess files, so
`/metrics` from any worker counts every worker's requests. Each worker is its own client of
the coordinator (request ids are unique per request, so the coordinator needs nothing more).
What a worker needs travels in one environment variable (`WORKER_ENV`, a msgspec-encoded
`WorkerSpec`): uvicorn's workers are made from an import string, not from objects.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from typing import TYPE_CHECKING

import msgspec

from omni_mp.http.app import ServerSettings, SharedStore

if TYPE_CHECKING:
    from fastapi import FastAPI

WORKER_ENV = "OMNI_MP_HTTP_WORKER"
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's switch to its multiprocess mode


class WorkerSpec(msgspec.Struct, frozen=True):
    config: str  # the pipeline's YAML (a resolved path)
    settings: ServerSettings


def build_app(config: str, settings: ServerSettings) -> FastAPI:
    """The app of one server process for the pipeline of `config` serving on settings.endpoint."""
    from omni_mp.client.omni_client import AsyncOmniClient
    from omni_mp.config.validate import load_config
    from omni_mp.http.app import create_app
    from omni_mp.http.detok import load_tokenizer
    from omni_mp.http.pipeline import PipelineView
    from omni_mp.wire.keys import INTERNAL, client_identity

    cfg = load_config(config)
    view = PipelineView.of(cfg)
    keys = None if cfg.security.keys is None else client_identity(cfg.security.keys, INTERNAL)
    tokenizer = None if view.text_stage is None else load_tokenizer(view.text_stage.model)
    return create_app(
        settings, view, tokenizer, lambda: AsyncOmniClient(settings.endpoint, limits=cfg.limits, keys=keys)
    )


def worker_app() -> FastAPI:
    """uvicorn's factory in each worker process (`omni_mp.http.workers:worker_app`)."""
    from omni_mp.utils.procs import die_with_parent

    die_with_parent(os.getppid())  # the supervisor: a worker never outlives it
    spec = msgspec.json.decode(os.environ[WORKER_ENV], type=WorkerSpec)
    return build_app(spec.config, spec.settings)


def run_workers(
    config: str, settings: ServerSettings, workers: int, host: str, port: int, log_level: str, shared: str | None
) -> None:
    """Serve with `workers` processes until stopped (SIGTERM / SIGINT to this process). `shared`:
    the private directory for their shared files (made here if None), emptied at the end."""
    import uvicorn

    shared = shared or tempfile.mkdtemp(prefix="omni_mp_http_")  # 0700: the transcripts are users' words
    try:
        metrics = os.path.join(shared, "metrics")
        os.mkdir(metrics)
        store = SharedStore(
            path=os.path.join(shared, "audio_ids.sqlite3"),
            tag=secrets.token_hex(6),
            voices_path=os.path.join(shared, "voices.sqlite3"),
        )
        spec = WorkerSpec(config=config, settings=msgspec.structs.replace(settings, shared_store=store))
        os.environ[WORKER_ENV] = msgspec.json.encode(spec).decode()
        os.environ[METRICS_ENV] = metrics  # read by prometheus_client when a worker imports it
        uvicorn.run(
            "omni_mp.http.workers:worker_app", factory=True, workers=workers, host=host, port=port,
            log_level=log_level, timeout_graceful_shutdown=5,
        )  # fmt: skip
    finally:
        shutil.rmtree(shared, ignore_errors=True)
