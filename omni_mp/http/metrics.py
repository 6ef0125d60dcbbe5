"""Prometheus metrics of the server and, per stage (labels stage_id and stage_name; the
process gauges and counters also `replica`, which replica of the stage), of the pipeline
behind it: read from each request's stage timings and, at scrape time, from the coordinator's
status, whose per-process `StageStats` (sent with each replica's heartbeats) become the
running/waiting gauges and the step and byte counters. Those counters restart from zero when
their replica restarts; Prometheus' rate() treats a drop as a counter reset.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from omni_mp.http.pipeline import PipelineView, stage_name
from omni_mp.wire.messages import StageDone, StageStatus, StatusReply

_STAGE = ("stage_id", "stage_name")
_REPLICA = (*_STAGE, "replica")  # what one stage process reports: per replica
PREPARE_PARTS = ("queued", "input", "engine_request", "engine_thread")  # omni_mp_stage_prepare_seconds
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class StageStatsCollector(Collector):
    """The stages' latest `StageStats`, as of the last status read at a scrape: values the stages
    count themselves, so they are exported as they are rather than incremented here."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.stages: list[StageStatus] = []
        self.inflight: int | None = None

    def collect(self) -> Iterator[Metric]:
        yield from self._liveness()
        yield from self._stats()

    def _liveness(self) -> Iterator[Metric]:
        """Alive, ready, restarts and requests in flight: gauges of the last status read."""
        alive = GaugeMetricFamily("omni_mp_stage_alive", "1 if the stage process is alive", labels=_REPLICA)
        ready = GaugeMetricFamily("omni_mp_stage_ready", "1 if the stage replica serves", labels=_REPLICA)
        restarts = GaugeMetricFamily("omni_mp_stage_restarts", "restarts of the stage replica so far", labels=_REPLICA)
        for s in self.stages:
            labels = [str(s.stage_id), self.names.get(s.stage_id, "?"), str(s.replica)]
            alive.add_metric(labels, int(s.alive))
            ready.add_metric(labels, int(s.ready))
            restarts.add_metric(labels, s.restarts)
        yield from (alive, ready, restarts)
        if self.inflight is not None:
            yield GaugeMetricFamily(
                "omni_mp_requests_inflight", "requests in flight in the coordinator", value=self.inflight
            )

    def _stats(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("omni_mp_stage_requests_running", "requests in the stage's engine", labels=_REPLICA)
        waiting = GaugeMetricFamily(
            "omni_mp_stage_requests_waiting", "requests registered in the stage, waiting on upstream or preparation",
            labels=_REPLICA,
        )  # fmt: skip
        steps = CounterMetricFamily("omni_mp_stage_engine_steps", "engine steps of the stage's run", labels=_REPLICA)
        step_s = CounterMetricFamily(
            "omni_mp_stage_engine_step_seconds", "time in engine steps (rate / steps rate: mean step time)",
            labels=_REPLICA,
        )  # fmt: skip
        sent = CounterMetricFamily(
            "omni_mp_stage_sent_bytes", "bytes sent to a downstream stage over its socket (shared memory excluded)",
            labels=[*_REPLICA, "downstream"],
        )  # fmt: skip
        for s in self.stages:
            if s.stats is None:
                continue
            labels = [str(s.stage_id), self.names.get(s.stage_id, "?"), str(s.replica)]
            running.add_metric(labels, s.stats.running)
            waiting.add_metric(labels, s.stats.waiting)
            steps.add_metric(labels, s.stats.steps)
            step_s.add_metric(labels, s.stats.step_seconds)
            for link in s.stats.sent:
                sent.add_metric([*labels, str(link.stage_id)], link.nbytes)
        yield from (running, waiting, steps, step_s, sent)


class Metrics:
    def __init__(self, view: PipelineView) -> None:
        self.registry = r = CollectorRegistry()
        self.names = {s.id: stage_name(s) for s in view.cfg.stages}
        self.requests = Counter(
            "omni_mp_http_requests", "HTTP requests by endpoint and outcome (ok or the error code)",
            ["endpoint", "code"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "omni_mp_http_request_seconds", "time to the last byte", ["endpoint"], buckets=_SECONDS, registry=r
        )
        self.first_audio = Histogram(
            "omni_mp_http_time_to_first_audio_seconds", "request received -> first audio bytes ready",
            ["endpoint"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.rtf = Histogram(
            "omni_mp_http_real_time_factor", "request wall time / seconds of audio produced", ["endpoint"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 50), registry=r,
        )  # fmt: skip
        self.audio_seconds = Counter("omni_mp_http_audio_seconds", "seconds of audio sent", registry=r)
        self.stage_tokens = Counter(
            "omni_mp_stage_output_tokens", "tokens (codes, audio steps) a stage produced", _STAGE, registry=r
        )
        self.stage_rate = Histogram(
            "omni_mp_stage_tokens_per_second", "per request: output tokens / (finished - first token)", _STAGE,
            buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000), registry=r,
        )  # fmt: skip
        self.stage_first = Histogram(
            "omni_mp_stage_time_to_first_token_seconds", "per request: registered -> first token", _STAGE,
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.stage_prepare = Histogram(
            "omni_mp_stage_prepare_seconds",
            "per request, an entry stage's preparation off the engine thread by part: queued (received -> a"
            " preparer took it), input (the model's input built: prompt format, media), engine_request (the"
            " engine's request built), engine_thread (prepared -> handed to the engine between steps)",
            [*_STAGE, "part"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.stage_start = Histogram(
            "omni_mp_stage_time_to_start_seconds",
            "per request: registered -> handed to the engine (prepared; downstream: its first input too)", _STAGE,
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.stage_stats = StageStatsCollector(self.names)
        r.register(self.stage_stats)
        # Several server processes (omni_mp.http.workers): the counters and histograms live in
        # prometheus_client's multiprocess files, summed over the workers at a scrape.
        self.shared: CollectorRegistry | None = None
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            self.shared = CollectorRegistry()
            MultiProcessCollector(self.shared)
            self.shared.register(self.stage_stats)

    def _labels(self, stage_id: int) -> dict[str, str]:
        return {"stage_id": str(stage_id), "stage_name": self.names.get(stage_id, "?")}

    def outcome(self, endpoint: str, code: str) -> None:
        self.requests.labels(endpoint=endpoint, code=code).inc()

    def stage_timings(self, timings: list[StageDone]) -> None:
        for d in timings:
            labels = self._labels(d.stage_id)
            self.stage_tokens.labels(**labels).inc(d.num_output_tokens)
            self.stage_start.labels(**labels).observe(max(0.0, d.t_started - d.t_registered))
            if d.t_prepare_taken is not None and d.t_input_built is not None and d.t_prepared is not None:
                marks = (d.t_registered, d.t_prepare_taken, d.t_input_built, d.t_prepared, d.t_started)
                for part, a, b in zip(PREPARE_PARTS, marks[:-1], marks[1:], strict=True):
                    self.stage_prepare.labels(**labels, part=part).observe(max(0.0, b - a))
            if d.t_first_token is not None:
                self.stage_first.labels(**labels).observe(max(0.0, d.t_first_token - d.t_registered))
                span = d.t_finished - d.t_first_token
                if span > 0 and d.num_output_tokens > 1:
                    self.stage_rate.labels(**labels).observe(d.num_output_tokens / span)

    def render(self, status: StatusReply | None) -> bytes:
        if status is not None:
            self.stage_stats.inflight = status.inflight
            self.stage_stats.stages = list(status.stages)
        return generate_latest(self.shared or self.registry)
