"""`python -m omni_mp.http --config X.yaml --endpoint ENDPOINT --listen HOST:PORT`: the
OpenAI-compatible server for a pipeline that already serves on ENDPOINT (the launcher's
`--http` starts it so). The API key comes from the environment (OMNI_MP_API_KEY), never
from the command line, where other users could read it."""

from __future__ import annotations

import argparse
import logging
import os

API_KEY_ENV = "OMNI_MP_API_KEY"


def parse_listen(spec: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:PORT') -> (host, port); ValueError if malformed."""
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--http: expected HOST:PORT, got {spec!r}")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="omni_mp.http", description=__doc__)
    p.add_argument("--config", required=True, help="the pipeline's YAML: a path or a shipped config's name")
    p.add_argument("--endpoint", required=True, help="the coordinator's client endpoint")
    p.add_argument("--listen", required=True, help="HOST:PORT")
    p.add_argument("--max-body-mb", type=float, default=64.0)
    p.add_argument("--parent-pid", type=int, help="exit when this process (the launcher) is gone")
    p.add_argument("--workers", type=int, help="server processes (default: the config's http.workers)")
    p.add_argument("--shared-dir", help="an empty private directory for the workers' shared files (default: a new one)")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s http %(levelname)s %(name)s: %(message)s")

    if args.parent_pid is not None:
        from omni_mp.utils.procs import die_with_parent

        die_with_parent(args.parent_pid)
    from omni_mp.config.validate import load_config
    from omni_mp.http.app import ServerSettings
    from omni_mp.http.workers import build_app, run_workers
    from omni_mp.stage_configs import resolve_config

    host, port = parse_listen(args.listen)
    config = str(resolve_config(args.config))
    cfg = load_config(config)
    body = int(args.max_body_mb * (1 << 20))
    settings = ServerSettings(
        endpoint=args.endpoint, model=cfg.name, api_key=os.environ.get(API_KEY_ENV) or None,
        max_body_bytes=body, max_media_bytes=body, audio_ids=cfg.http.audio_ids,
        cloned_voices=cfg.http.cloned_voices,
    )  # fmt: skip
    workers = args.workers or cfg.http.workers
    print(f"omni_mp http serving {cfg.name!r} on http://{args.listen} ({workers} worker(s))", flush=True)
    if workers > 1:
        run_workers(config, settings, workers, host, port, args.log_level.lower(), args.shared_dir)
    else:
        import uvicorn

        app = build_app(config, settings)
        uvicorn.run(app, host=host, port=port, log_level=args.log_level.lower(), timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    from omni_mp.utils.procs import exit_now

    exit_now(main())  # uvicorn has closed its sockets and the client its own: skip the finalization
