"""What one job process counts, served as Prometheus text on ``/metrics``.

The counting costs the hot path almost nothing: per finished row, :meth:`ShardMetrics.observe`
adds to a few plain integers (called from the shard's result callback, on the event loop); per
request the runner bumps one counter on its endpoint. Everything else (requests per endpoint,
in-flight requests, per-attempt errors, the ledger's totals) is read when a scrape asks, in
:meth:`ShardMetrics.collect`. Each process has its own ``CollectorRegistry`` (never the global
one), served by ``prometheus_client`` on a daemon thread; the URL goes into the shard's
progress file (``metrics_url``), where `prefect-swarm top` and a Prometheus file_sd list find it.
``JobSpec.metrics_host`` picks the address (:func:`metrics_address`: loopback for a local swarm, all
interfaces elsewhere) or turns the server off (null).

Names (labels ``job_id`` and ``shard`` on every series)::

    prefect_swarm_rows_total{status=ok|failed}       rows finished by this process
    prefect_swarm_rows_retried_total                 rows that needed more than one request
    prefect_swarm_requests_total{endpoint}           requests sent
    prefect_swarm_requests_in_flight                 requests awaiting an answer now
    prefect_swarm_errors_total{kind,code}            http (code = status), connection, timeout (per
                                                     request); parse, refused (per row)
    prefect_swarm_request_latency_seconds            time to the last byte of a row's last answer
    prefect_swarm_prompt_tokens_total / prefect_swarm_completion_tokens_total
    prefect_swarm_shard_rows{kind=total|done|failed} the shard's ledger (resumed rows included)
"""

from __future__ import annotations

import bisect
import socket
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from prefect_swarm.jobs.checkpoint.ledger import STATUS_OK, RowResult

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prefect_swarm.jobs.checkpoint.ledger import ShardLedger
    from prefect_swarm.jobs.dispatch.runner import Runner

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Upper bounds (seconds) of the latency histogram (vLLM's end-to-end buckets, from 5 ms)."""

_BOUNDS_MS = tuple(b * 1000 for b in LATENCY_BUCKETS)


AUTO_HOST = "auto"
"""``JobSpec.metrics_host`` default: loopback when every endpoint is on this machine, else all interfaces."""

_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def metrics_address(setting: str | None, endpoints: Iterable[str]) -> str | None:
    """The address the job's ``/metrics`` listens on for ``JobSpec.metrics_host`` (None: serve none).

    ``auto``: ``127.0.0.1`` when every endpoint is on this machine (a local swarm: nothing on the
    network needs the figures), else ``0.0.0.0`` so a scraper on another node (Prometheus, `top` on a
    login node) reaches it. An empty setting is None too.
    """
    if not setting:
        return None
    if setting != AUTO_HOST:
        return setting
    hosts = {urlsplit(e).hostname or "" for e in endpoints}
    local = bool(hosts) and all(h in _LOOPBACK_HOSTS or h.startswith("127.") for h in hosts)
    return "127.0.0.1" if local else "0.0.0.0"


class ShardMetrics:
    """The counters of one shard's process, and the ``/metrics`` server that shows them."""

    def __init__(self, job_id: str, shard: int) -> None:
        self.labels = {"job_id": job_id, "shard": str(shard)}
        self.ok = self.failed = self.retried = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.row_errors: Counter[str] = Counter()
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum_ms = 0.0
        self.runner: Runner | None = None
        self.ledger: ShardLedger | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server: WSGIServer | None = None
        self.url: str | None = None

    # ------------------------------------------------------------------ counting (hot path)
    def observe(self, r: RowResult) -> None:
        """Count one finished row (a few integer additions)."""
        if r.status == STATUS_OK:
            self.ok += 1
            self.prompt_tokens += r.prompt_tokens
            self.completion_tokens += r.completion_tokens
        else:
            self.failed += 1
            if r.http_status == 200:
                self.row_errors["parse"] += 1
        if r.attempts > 1:
            self.retried += 1
        if r.http_status:
            self.latency_counts[bisect.bisect_left(_BOUNDS_MS, r.latency_ms)] += 1
            self.latency_sum_ms += r.latency_ms

    def refused(self) -> None:
        """Count a row that failed before any request was sent (a null column, a body that would not build)."""
        self.failed += 1
        self.row_errors["refused"] += 1

    # ------------------------------------------------------------------ serving
    def serve(self, addr: str = "0.0.0.0", port: int = 0) -> str:
        """Serve ``/metrics`` on ``addr:port`` (0: a free port) on a daemon thread; return its URL.

        The URL names this host by its name when listening on every interface, so a scraper on
        another node (Prometheus, `prefect-swarm top` on a login node) can reach it. IPv4 only.
        """
        self._server = make_server(addr, port, make_wsgi_app(self.registry), ThreadingWSGIServer, _Quiet)
        # a short poll, so that close() (and the process's exit) does not wait half a second
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True, name="metrics").start()
        host = socket.gethostname() if addr in ("0.0.0.0", "") else addr
        self.url = f"http://{host}:{self._server.server_port}/metrics"
        return self.url

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server_close()

    # ------------------------------------------------------------------ scrape
    def describe(self) -> list[Metric]:
        """Nothing to describe up front (``collect`` runs at each scrape)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, built from the counters and the runner's and ledger's state now."""
        yield from self._rows()
        yield from self._requests()
        yield self._latency()

    def _family(self, cls: Any, name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        return cls(name, doc, labels=[*self.labels, *extra])

    def _rows(self) -> Iterator[Metric]:
        base = list(self.labels.values())
        rows = self._family(CounterMetricFamily, "prefect_swarm_rows", "Rows finished by this process.", ("status",))
        rows.add_metric([*base, "ok"], self.ok)
        rows.add_metric([*base, "failed"], self.failed)
        yield rows
        retried = self._family(
            CounterMetricFamily, "prefect_swarm_rows_retried", "Rows that needed more than one request."
        )
        retried.add_metric(base, self.retried)
        yield retried
        for name, value, doc in (
            ("prefect_swarm_prompt_tokens", self.prompt_tokens, "Prompt tokens of the rows answered."),
            ("prefect_swarm_completion_tokens", self.completion_tokens, "Completion tokens of the rows answered."),
        ):
            fam = self._family(CounterMetricFamily, name, doc)
            fam.add_metric(base, value)
            yield fam
        if self.ledger is not None:
            led = self.ledger
            shard = self._family(
                GaugeMetricFamily,
                "prefect_swarm_shard_rows",
                "Rows of the shard in its ledger (resumed rows too).",
                ("kind",),
            )
            for kind, value in (("total", led.total), ("done", led.n_done), ("failed", led.n_failed)):
                shard.add_metric([*base, kind], value)
            yield shard

    def _requests(self) -> Iterator[Metric]:
        base = list(self.labels.values())
        sent = self._family(
            CounterMetricFamily, "prefect_swarm_requests", "Requests sent, per endpoint.", ("endpoint",)
        )
        errors = self._family(
            CounterMetricFamily,
            "prefect_swarm_errors",
            "Errors: per request (http with its status code, connection, timeout); per row (parse, refused).",
            ("kind", "code"),
        )
        inflight = self._family(GaugeMetricFamily, "prefect_swarm_requests_in_flight", "Requests awaiting an answer.")
        per_attempt: Counter[tuple[str, str]] = Counter()
        outstanding = 0
        for ep in self.runner.pool.endpoints if self.runner is not None else ():
            sent.add_metric([*base, ep.url], ep.sent)
            outstanding += ep.outstanding
            per_attempt["connection", ""] += ep.conn_errors
            per_attempt["timeout", ""] += ep.timeouts
            for status, n in ep.statuses.items():
                per_attempt["http", str(status)] += n
        for row_kind, n in self.row_errors.items():
            per_attempt[row_kind, ""] += n
        for (kind, code), n in sorted(per_attempt.items()):
            errors.add_metric([*base, kind, code], n)
        inflight.add_metric(base, outstanding)
        yield sent
        yield errors
        yield inflight

    def _latency(self) -> Metric:
        hist = self._family(
            HistogramMetricFamily,
            "prefect_swarm_request_latency_seconds",
            "Time to the last byte of each row's last answer.",
        )
        buckets, running = [], 0
        for bound, n in zip((*(f"{b:g}" for b in LATENCY_BUCKETS), "+Inf"), self.latency_counts, strict=True):
            running += n
            buckets.append((bound, running))
        hist.add_metric(list(self.labels.values()), buckets, self.latency_sum_ms / 1000)
        return hist


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape on the job's stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        """Say nothing."""


__all__ = ["AUTO_HOST", "LATENCY_BUCKETS", "ShardMetrics", "metrics_address"]
