"""`python -m omni_mp.launch` / `omni-mp`: run prompts through a pipeline, or serve it.

With `--prompt`/`--prompts-file`: start the pipeline, submit every prompt concurrently, show
a progress bar, write one JSON file per request to `--output-dir` (and a WAV per audio output,
a PNG per image), print a per-request summary (stage timings, tokens) and exit (status 1 if
any request failed). Image pipelines take `--size`, `--steps`, `--seed` (request i gets
seed + i; drawn when not given, and written to the JSON record), `--negative-prompt`,
`--cfg-scale`.
Without prompts: bind the client endpoint (`--bind`), print it, serve until SIGINT/SIGTERM.
`omni-mp keys DIR [--client NAME ...]`: create a CURVE key directory (see omni_mp.wire.keys).

Exit codes: 0 ok, 1 a request failed, 2 bad config, 3 a stage failed to start, 4 the
coordinator failed while serving, 5 a stage is down for good (it died with its restart budget
spent, `restart.when_spent: stop`): no request can be served, so serving stops.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from omni_mp import stage_configs
from omni_mp.media.audio_io import write_wav
from omni_mp.media.image_io import draw_seed, parse_size, write_png
from omni_mp.wire.messages import Finished

if TYPE_CHECKING:
    from omni_mp.config.schema import PipelineConfig
    from omni_mp.control.coordinator import Coordinator

EXIT_STAGE_DOWN = 5


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="omni-mp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config",
        default=stage_configs.DEFAULT,
        help=f"pipeline YAML: a path, or a shipped config's name ({', '.join(stage_configs.shipped())}; "
        "default: %(default)s)",
    )
    p.add_argument("--prompt", action="append", default=[], help="a prompt to run (repeatable)")
    p.add_argument("--prompts-file", type=Path, help="a file with one prompt per line")
    p.add_argument("--output-dir", type=Path, help="write one JSON result per request here")
    p.add_argument("--bind", help="client endpoint to serve on (default: an ipc endpoint, printed)")
    p.add_argument("--deadline", type=float, help="per-request deadline in seconds")
    p.add_argument("--audio", action="append", default=[], type=Path, help="a WAV file to send with every prompt")
    p.add_argument("--image", action="append", default=[], type=Path, help="an image file to send with every prompt")
    p.add_argument("--speaker", help="the voice of stages that speak (default: the model's)")
    img = p.add_argument_group("images (pipelines whose final stage makes images)")
    img.add_argument("--size", help="WIDTHxHEIGHT of each image (default: the model's)")
    img.add_argument("--steps", type=int, help="denoising steps (num_inference_steps; default: the model's)")
    img.add_argument("--seed", type=int, help="noise seed of the first request; request i gets seed + i")
    img.add_argument("--negative-prompt", help="negative prompt (true classifier-free guidance)")
    img.add_argument("--cfg-scale", type=float, help="true CFG scale (true_cfg_scale), used with --negative-prompt")
    p.add_argument("--http", metavar="HOST:PORT", help="also serve the OpenAI-compatible HTTP API (omni_mp.http)")
    p.add_argument("--api-key", help="--http: require `Authorization: Bearer KEY` (default: env OMNI_MP_API_KEY)")
    p.add_argument("--log-dir", type=Path, help="keep stage logs here (default: a temp dir, removed at exit)")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def _keys_main(argv: list[str]) -> int:
    from omni_mp.wire.keys import KeyFileError, generate

    p = argparse.ArgumentParser(prog="omni-mp keys", description="create a CURVE key directory (files 0600)")
    p.add_argument("dir", type=Path, help="the key directory (name it in the YAML: `security: {keys: DIR}`)")
    p.add_argument("--client", action="append", default=[], help="also create a client keypair NAME (repeatable)")
    args = p.parse_args(argv)
    try:
        written = generate(args.dir, args.client)
    except (KeyFileError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file is not None:
        prompts += [line.rstrip("\n") for line in args.prompts_file.read_text().splitlines() if line.strip()]
    return prompts


def _check_media(cfg: PipelineConfig, audios: list[Path], images: list[Path]) -> None:
    """Read every --audio and --image file now, before any stage starts, and check that the
    entry stages take that much media (ValueError or OSError naming the file or the limit)."""
    if not audios and not images:
        return
    from omni_mp.client.media import multi_modal_input

    for path in [*audios, *images]:
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
    from omni_mp.media.limits import check_media_sizes, stage_media_limits

    try:
        media = multi_modal_input(audios, images)
    except (ValueError, OSError) as err:  # PIL's UnidentifiedImageError is an OSError
        raise ValueError(f"cannot read the media files: {err}") from None
    assert media is not None
    sizes = [(a.samples.shape[0], a.sample_rate) for a in media.audios]
    pixels = [(im.pixels.shape[0], im.pixels.shape[1]) for im in media.images]
    for stage in cfg.entry_stages:
        if stage.prompt_format is None:
            raise ValueError(f"stage {stage.id} takes no media (it has no `prompt_format`): drop --audio/--image")
        check_media_sizes(stage.id, stage_media_limits(stage), sizes, pixels)  # counts, seconds, pixels


IMAGE_FLAGS = {"size": "--size", "steps": "--steps", "seed": "--seed", "negative_prompt": "--negative-prompt",
               "cfg_scale": "--cfg-scale"}  # fmt: skip


def _image_params(cfg: PipelineConfig, args: argparse.Namespace) -> dict[str, object] | None:
    """The image params every request gets (its seed added per request); None for a pipeline
    that makes no images. ValueError naming a flag it cannot take."""
    from omni_mp.models.registry import makes_images

    given = [flag for name, flag in IMAGE_FLAGS.items() if getattr(args, name) is not None]
    if not any(s.kind == "diffusion" and makes_images(s.diffusion.model_type) for s in cfg.final_stages):
        if given:
            raise ValueError(f"{', '.join(given)}: pipeline {cfg.name!r} makes no images")
        return None
    params: dict[str, object] = {}
    if args.size is not None:
        params["width"], params["height"] = parse_size(args.size)
    if args.steps is not None:
        params["num_inference_steps"] = args.steps
    if args.negative_prompt is not None:
        params["negative_prompt"] = args.negative_prompt
    if args.cfg_scale is not None:
        params["true_cfg_scale"] = args.cfg_scale
    if args.seed is None:
        args.seed = draw_seed()
    return params


def _say(msg: str) -> None:
    """A progress line on stderr. Best effort: when the reader is gone (a closed terminal, a
    supervisor that died, `| head`), the write fails, and a server must go on serving, or
    shutting down, rather than die or hang on a message nobody can read."""
    try:
        print(f"[omni_mp] {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _say_what_the_demo_is(cfg: PipelineConfig, output_dir: Path | None) -> None:
    """Built-in tiny checkpoints have random weights: say so, so that gibberish text and noise
    are not taken for a fault; and say where the results go."""
    from omni_mp.models.registry import names

    tiny = sorted({s.model for s in cfg.stages} & set(names("builtin_models")))
    if tiny:
        _say(
            f"note: {', '.join(tiny)} = built-in tiny model(s) with random weights (for trying omni_mp out): "
            "the text is gibberish and the audio is noise; point `model:` at a real checkpoint for real answers"
        )
    if output_dir is not None:
        _say(f"results go to {output_dir.resolve()}/ (one JSON per request, a WAV per audio output, a PNG per image)")


def _write_audio(res: Finished, out_dir: Path | None, stem: str) -> tuple[Finished, dict[str, str]]:
    """Write each audio output as `<stem>.stage<id>.wav` (16-bit PCM); returns the result without
    the samples (its JSON record stays small) and the file name per stage id."""
    outputs, files = [], {}
    for out in res.outputs:
        if out.audio is not None and out.sample_rate:
            where = ""
            if out_dir is not None:
                files[str(out.stage_id)] = name = f"{stem}.stage{out.stage_id}.wav"
                write_wav(out_dir / name, out.audio, out.sample_rate)
                where = f" -> {out_dir / name}"
            print(f"{stem}: stage {out.stage_id}: {out.audio.shape[-1] / out.sample_rate:.2f} s of audio{where}")
            out = msgspec.structs.replace(out, audio=None)
        outputs.append(out)
    return msgspec.structs.replace(res, outputs=outputs), files


def _write_image(
    res: Finished, out_dir: Path | None, stem: str, seed: int | None
) -> tuple[Finished, dict[str, object]]:
    """Write the request's image as `<stem>.png` (a second image stage's as
    `<stem>.stage<id>.png`); returns the result without the pixels and what the JSON record
    says of each image (file, width, height, seed)."""
    outputs, records = [], {}
    for out in res.outputs:
        if out.image is not None:
            height, width = int(out.image.shape[0]), int(out.image.shape[1])
            name = f"{stem}.png" if not records else f"{stem}.stage{out.stage_id}.png"
            record: dict[str, object] = {"width": width, "height": height, "seed": seed}
            where = ""
            if out_dir is not None:
                write_png(out_dir / name, out.image)
                record["file"] = name
                where = f" -> {out_dir / name}"
            records[str(out.stage_id)] = record
            print(f"{stem}: stage {out.stage_id}: {width}x{height} image, seed {seed}{where}")
            out = msgspec.structs.replace(out, image=None)
        outputs.append(out)
    return msgspec.structs.replace(res, outputs=outputs), records


def _summary(res: Finished) -> str:
    """One line per request: per stage its tokens (codes) and timings from submission, the
    audio's length and time to first audio, and the text."""
    ms = lambda t: f"{1000 * (t - res.t_submit):.0f}ms"  # noqa: E731
    audio = {
        o.stage_id: o.audio.shape[-1] / o.sample_rate for o in res.outputs if o.audio is not None and o.sample_rate
    }
    image = {o.stage_id: f"{o.image.shape[1]}x{o.image.shape[0]} image" for o in res.outputs if o.image is not None}
    parts = []
    for d in res.stage_timings:
        first = ms(d.t_first_token) if d.t_first_token is not None else "-"
        what = (
            f"{audio[d.stage_id]:.2f}s audio" if d.stage_id in audio
            else image.get(d.stage_id, f"{d.num_output_tokens} tok")
        )  # fmt: skip
        parts.append(f"stage {d.stage_id}: {d.num_prompt_tokens} in, {what}, first {first}, done {ms(d.t_finished)}")
    text = next((o.text for o in res.outputs if o.text is not None), None)
    return f"{ms(res.t_finished)} [{' | '.join(parts)}] -> {text!r}"


def _run_prompts(
    client: object,
    prompts: list[str],
    args: argparse.Namespace,
    server: threading.Thread,
    image_params: dict[str, object] | None,
) -> int | None:
    """Run the prompts; None if the coordinator thread died before they all ended."""
    from tqdm import tqdm

    from omni_mp.client.omni_client import OmniClient, RequestError

    assert isinstance(client, OmniClient)
    results: dict[int, object] = {}
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(prompts))) as pool:
        futs = {
            pool.submit(
                client.generate,
                p,
                deadline_s=args.deadline,
                request_id=f"req{i}",
                audios=args.audio,
                images=args.image,
                speaker=args.speaker,
                params=None if image_params is None else {**image_params, "seed": args.seed + i},
            ): i
            for i, p in enumerate(prompts)
        }
        pending = set(futs)
        with tqdm(total=len(prompts), desc="requests", unit="req", file=sys.stderr) as bar:
            while pending:
                done, pending = concurrent.futures.wait(pending, timeout=0.5, return_when="FIRST_COMPLETED")
                for fut in done:
                    try:
                        results[futs[fut]] = fut.result()
                    except RequestError as err:
                        results[futs[fut]] = err
                    bar.update(1)
                if pending and not server.is_alive():
                    client.close()  # ends the waiting calls (client_closed)
                    return None
    wall = time.time() - t0
    failed = 0
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    for i, prompt in enumerate(prompts):
        res = results[i]
        if isinstance(res, RequestError):
            failed += 1
            record: dict[str, object] = {"prompt": prompt, "error": msgspec.to_builtins(res.event)}
            print(f"req{i}: ERROR {res}")
        else:
            line = _summary(res)  # type: ignore[arg-type]
            res, wavs = _write_audio(res, args.output_dir, f"req{i}")  # type: ignore[arg-type]
            seed = None if image_params is None else args.seed + i
            res, images = _write_image(res, args.output_dir, f"req{i}", seed)
            record = {"prompt": prompt, **msgspec.to_builtins(res), **({"audio_files": wavs} if wavs else {})}
            if images:
                record["images"] = images
            print(f"req{i}: {line}")
        if args.output_dir is not None:
            (args.output_dir / f"req{i}.json").write_text(json.dumps(record, indent=2))
    print(f"{len(prompts) - failed}/{len(prompts)} requests succeeded in {wall:.2f}s")
    return 1 if failed else 0


def _checked(args: argparse.Namespace) -> tuple[PipelineConfig, list[str], dict[str, object] | None]:
    """The config, the prompts and the image params, every check that needs no stage done
    (ConfigError, OSError or ValueError naming what is wrong)."""
    from omni_mp.config.validate import check_models, load_config, validate  # (after `keys`: no torch

    # The quick checks first: a mistyped model or file is reported before engine_args are checked.
    args.config = stage_configs.resolve_config(args.config)
    cfg = load_config(args.config, check_engine_args=False)
    check_models(cfg)
    prompts = _prompts(args)
    _check_media(cfg, args.audio, args.image)
    image_params = _image_params(cfg, args)
    cfg = validate(cfg)  # engine_args against vLLM's EngineArgs
    if args.http:
        from omni_mp.http.__main__ import parse_listen

        parse_listen(args.http)
    return cfg, prompts, image_params


def _work(
    coord: Coordinator,
    cfg: PipelineConfig,
    args: argparse.Namespace,
    prompts: list[str],
    image_params: dict[str, object] | None,
    server: threading.Thread,
    stop: threading.Event,
) -> int | None:
    """Serve (with the HTTP server if asked) or run the prompts; the pipeline is shut down after,
    whatever failed. None: the coordinator stopped."""
    from omni_mp.client.omni_client import OmniClient
    from omni_mp.wire.keys import INTERNAL, client_identity

    http = None
    try:
        if not prompts:
            if args.http:
                from omni_mp.http.process import start_http

                http = start_http(args.config, coord.client_endpoint, args.http, args.api_key)
            print(f"omni_mp serving pipeline {cfg.name!r} on {coord.client_endpoint}", flush=True)
            return _serve(coord, stop)
        keys = None if cfg.security.keys is None else client_identity(cfg.security.keys, INTERNAL)
        with OmniClient(coord.client_endpoint, limits=cfg.limits, keys=keys) as client:
            return _run_prompts(client, prompts, args, server, image_params)
    finally:
        _say("shutting down the pipeline")
        try:
            if http is not None:
                from omni_mp.http.process import stop_http

                stop_http(http)
        finally:  # whatever failed above, the stages and the coordinator thread must end
            coord.stop()
            server.join()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keys"]:
        return _keys_main(argv[1:])
    args = _parse(argv)
    from omni_mp.config.schema import ConfigError

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg, prompts, image_params = _checked(args)
    except (ConfigError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    from omni_mp.control.coordinator import Coordinator, StartupError

    try:
        coord = Coordinator(cfg, client_bind=args.bind, log_dir=args.log_dir, progress=_say)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stop = threading.Event()
    crashed: list[BaseException] = []

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        coord.stop()
        _say(f"got signal {signum}, shutting down")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        coord.start()
    except StartupError as err:
        print(f"error: pipeline failed to start: {err}", file=sys.stderr)
        return 3

    def serve() -> None:
        try:
            coord.run()
        except BaseException as err:
            crashed.append(err)
            logging.getLogger("omni_mp.cli").exception("the coordinator failed")
        finally:
            stop.set()  # the main thread must not wait on a coordinator that is gone

    server = threading.Thread(target=serve, name="coordinator")
    server.start()
    _say_what_the_demo_is(cfg, args.output_dir if prompts else None)
    code = _work(coord, cfg, args, prompts, image_params, server, stop)
    if crashed or code is None:
        print(f"error: the coordinator failed: {crashed[0] if crashed else 'it stopped'!r}", file=sys.stderr)
        return 4
    return EXIT_STAGE_DOWN if coord.down_for_good() else code


def _serve(coord: Coordinator, stop: threading.Event) -> int:
    """Serve until a signal (0), or until a stage is down for good (EXIT_STAGE_DOWN)."""
    while not stop.wait(0.5):
        down = coord.down_for_good()
        if down:
            for sid, why in sorted(down.items()):
                print(f"error: stage {sid} is down for good (restart budget spent): {why}", file=sys.stderr)
            _say("no request can be served")
            return EXIT_STAGE_DOWN
    return 0


def cli() -> None:
    """The `omni-mp` command: `main`, then a prompt exit (see omni_mp.utils.procs.exit_now)."""
    from omni_mp.utils.procs import exit_now

    exit_now(main())


if __name__ == "__main__":
    cli()
