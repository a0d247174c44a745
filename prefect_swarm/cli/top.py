"""``prefect-swarm top NAME``: a swarm and its jobs, live.

Per replica: health (the backend's status), running and waiting requests, generation tok/s and KV
cache usage (scraped from the engine's ``/metrics``, found through
:meth:`ServingBackend.metrics_targets`). The load balancer (Slurm: nginx): active connections,
accepted/handled connections and requests, requests/s, from nginx's ``stub_status`` at
``/nginx-status`` on the swarm's endpoint (backends/slurm/templates/nginx.conf.j2). Per job: rows done/failed of
total, rows/s and ETA
(from the shards' progress files; the ETA is the projection's time left, and ``-o json`` carries the
whole projection, :func:`~prefect_swarm.config.cost.job_projection`), requests in flight (scraped
from the job processes' own ``/metrics``). What a backend cannot report is ``null`` with the reason
(``n/a`` in the table).

``--once -o json`` prints one document (two scrapes ``--interval`` apart, for the rates) and exits;
the live view refreshes every ``--interval`` seconds until ``q`` (or Ctrl-C).
"""

from __future__ import annotations

import contextlib
import re
import select
import sys
import termios
import time
import tty
import urllib.request
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live

from prefect_swarm.backends.registry import ENTRIES
from prefect_swarm.cli.output import OutputFormat, console, emit_json, table
from prefect_swarm.config.cost import job_projection
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces.metrics import Samples, authorized, scrape, total
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.state import JobRecord, StateStore

GEN_TOKENS = "vllm:generation_tokens_total"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""vLLM >= 0.10 names the KV cache gauge ``kv_cache_usage_perc``; older ones ``gpu_cache_usage_perc``."""

NGINX_STATUS_PATH = "/nginx-status"
"""nginx ``stub_status`` location of the LB (prefect_swarm/backends/slurm/templates/nginx.conf.j2)."""

NGINX_LB_BACKENDS = frozenset(kind for kind, entry in ENTRIES.items() if entry.nginx_lb)
"""Backends whose swarm endpoint is our nginx (the LB job; their entries say so); elsewhere the LB figures are n/a."""

LB_FIELDS = ("active", "accepted", "handled", "requests", "reading", "writing", "waiting")

_STUB_STATUS = re.compile(
    r"Active connections:\s*(\d+).*?server accepts handled requests\s+(\d+)\s+(\d+)\s+(\d+)"
    r".*?Reading:\s*(\d+)\s+Writing:\s*(\d+)\s+Waiting:\s*(\d+)",
    re.S,
)


def parse_stub_status(text: str) -> dict[str, int]:
    """nginx ``stub_status`` text -> ``{active, accepted, handled, requests, reading, writing, waiting}``.

    Raises ValueError when ``text`` is not a stub_status page."""
    found = _STUB_STATUS.search(text)
    if found is None:
        raise ValueError(f"not an nginx stub_status page: {text[:80]!r}")
    return dict(zip(LB_FIELDS, (int(g) for g in found.groups()), strict=True))


class TopSampler:
    """Looks at one swarm; keeps the previous scrape of each target so that rates can be computed."""

    def __init__(self, name: str, store: StateStore | None = None) -> None:
        self.name = name
        self.store = store or StateStore()
        self.swarm = default_holding(self.store).attach(name)
        self.previous: dict[str, tuple[float, Samples]] = {}
        self.previous_lb: tuple[float, int] | None = None
        self.key = self.swarm.backends.serving.client_key()  # a closed swarm wants it on /metrics too

    def view(self) -> dict[str, Any]:
        """The document ``top -o json`` prints (stable keys)."""
        rec = self.store.require_swarm(self.name)
        status = self.swarm.status()
        targets = (
            self.swarm.backends.serving.metrics_targets(self.swarm.handle) if self.swarm.handle is not None else None
        )
        engines = {t.labels.get("replica"): t for t in targets.targets} if targets else {}
        reason = targets.reason if targets else "no backend handle recorded"
        replicas = []
        for r in status.replicas:
            target = engines.get(str(r.index))
            row: dict[str, Any] = {"index": r.index, "health": r.health.value, "url": r.url}
            row.update(self._engine(target.url) if target else _na(reason or "not a metrics target (not routed)"))
            replicas.append(row)
        jobs = [self._job(j, rec.config) for j in self.store.list_jobs(self.name) if j.status.active]
        return {
            "swarm": {"name": rec.name, "backend": rec.backend, "phase": status.phase.value, "detail": status.detail},
            "lb": self._lb(rec.backend, status.url),
            "replicas": replicas,
            "jobs": jobs,
            "metrics_targets": [t.url for t in targets.targets] if targets else [],
            "metrics_reason": reason,
        }

    def _rate(self, url: str, samples: Samples, name: str) -> float | None:
        """Per second growth of counter ``name`` since the previous scrape of ``url`` (None: first look);
        ``samples`` become the previous scrape."""
        now, before = time.monotonic(), self.previous.get(url)
        self.previous[url] = (now, samples)
        value = total(samples, name)
        old = total(before[1], name) if before else None
        if before is None or value is None or old is None or now <= before[0]:
            return None
        return round(max(0.0, value - old) / (now - before[0]), 1)

    def _engine(self, url: str) -> dict[str, Any]:
        try:
            samples = scrape(url, api_key=self.key)
        except OSError as exc:
            return _na(f"{url}: {exc}")
        kv = next((v for v in (total(samples, k) for k in KV_USAGE) if v is not None), None)
        gen = total(samples, GEN_TOKENS)
        tok_s = self._rate(url, samples, GEN_TOKENS)
        return {
            "running": total(samples, "vllm:num_requests_running"),
            "waiting": total(samples, "vllm:num_requests_waiting"),
            "kv_cache_usage": kv,
            "generation_tokens": gen,
            "tok_s": tok_s,
            "metrics_url": url,
            "metrics_error": None,
        }

    def _lb(self, backend: str, endpoint: str | None) -> dict[str, Any]:
        """The LB's connection and request counts (nginx stub_status), or n/a with the reason."""
        if backend not in NGINX_LB_BACKENDS:
            return _lb_na(f"no nginx load balancer on the {backend} backend")
        if not endpoint:
            return _lb_na("the LB is not up (no endpoint yet)")
        url = endpoint.rstrip("/").removesuffix("/v1") + NGINX_STATUS_PATH
        try:
            with urllib.request.urlopen(authorized(url, self.key), timeout=2.0) as resp:
                counts = parse_stub_status(resp.read().decode("utf-8", "replace"))
        except (OSError, ValueError) as exc:
            return {**_lb_na(f"{url}: {exc}"), "url": url}
        now, before = time.monotonic(), self.previous_lb
        self.previous_lb = (now, counts["requests"])
        rate = None
        if before is not None and now > before[0]:
            rate = round(max(0, counts["requests"] - before[1]) / (now - before[0]), 1)
        return {"url": url, **counts, "requests_s": rate, "error": None}

    def _job(self, rec: JobRecord, swarm_config: dict[str, Any]) -> dict[str, Any]:
        from prefect_swarm.jobs.checkpoint.plan import recorded_progress  # pyarrow: only where progress is shown

        spec = JobSpec.model_validate(rec.spec) if rec.spec and "input" in rec.spec else None
        shards = [recorded_progress(spec, i) if spec else {} for i in range(rec.nshards)]
        running = [p for p in shards if p.get("state") == "running"]
        done = sum(int(p.get("done") or 0) for p in shards)
        failed = sum(int(p.get("failed") or 0) for p in shards)
        total_rows = sum(int(p.get("total") or 0) for p in shards) or None
        rate = round(sum(float(p.get("rate_rows_s") or 0) for p in running), 1)
        projected = job_projection(
            {"done": done, "total": total_rows or 0, "rate_rows_s": rate, "shards": shards},
            swarm_config,
            min_elapsed_s=0,
        )
        eta = round(projected["remaining_s"]) if projected["ready"] else None
        inflight: float | None = None
        for url in (p["metrics_url"] for p in running if p.get("metrics_url")):
            with contextlib.suppress(OSError):
                value = total(scrape(url), "prefect_swarm_requests_in_flight")
                if value is not None:
                    inflight = (inflight or 0) + value
        return {
            "id": rec.id,
            "status": rec.status.value,
            "nshards": rec.nshards,
            "shards_running": len(running),
            "done": done,
            "failed": failed,
            "total": total_rows,
            "rate_rows_s": rate,
            "eta_s": eta,
            "projection": projected,
            "in_flight": inflight,
        }


def _lb_na(reason: str) -> dict[str, Any]:
    return {"url": None, **dict.fromkeys(LB_FIELDS), "requests_s": None, "error": reason}


def _na(reason: str) -> dict[str, Any]:
    return {
        "running": None,
        "waiting": None,
        "kv_cache_usage": None,
        "generation_tokens": None,
        "tok_s": None,
        "metrics_url": None,
        "metrics_error": reason,
    }


def render(doc: dict[str, Any]) -> Group:
    """The rich tables of one look."""
    sw = doc["swarm"]
    reps = table(
        f"swarm {sw['name']} ({sw['backend']}): {sw['phase']}",
        ["replica", "health", "running", "waiting", "tok/s", "KV cache", "note"],
        (
            [
                r["index"],
                r["health"],
                _cell(r["running"]),
                _cell(r["waiting"]),
                _cell(r["tok_s"]),
                "n/a" if r["kv_cache_usage"] is None else f"{100 * r['kv_cache_usage']:.0f}%",
                r["metrics_error"] or "",
            ]
            for r in doc["replicas"]
        ),
    )
    lb = doc["lb"]
    lbs = table(
        "load balancer",
        ["active", "accepted", "handled", "requests", "req/s", "note"],
        [[*(_cell(lb[k]) for k in ("active", "accepted", "handled", "requests", "requests_s")), lb["error"] or ""]],
    )
    jobs = table(
        "jobs",
        ["job", "status", "done", "failed", "total", "rows/s", "ETA", "in flight"],
        (
            [
                j["id"],
                j["status"],
                j["done"],
                j["failed"],
                j["total"],
                j["rate_rows_s"],
                "n/a" if j["eta_s"] is None else f"{j['eta_s']}s",
                _cell(j["in_flight"]),
            ]
            for j in doc["jobs"]
        ),
    )
    return Group(reps, lbs, jobs, "[dim]q to quit[/dim]")


def _cell(value: Any) -> str:
    return "n/a" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


@contextlib.contextmanager
def _keys() -> Iterator[None]:
    """stdin in cbreak mode while the live view runs (when it is a terminal)."""
    if not sys.stdin.isatty():
        yield
        return
    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def _quit_pressed(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a key on stdin (a terminal or a pipe); True when it was ``q``."""
    try:
        ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    except (OSError, ValueError):  # no stdin to read from: Ctrl-C stops the view
        time.sleep(timeout_s)
        return False
    if not ready:
        return False
    key = sys.stdin.read(1)
    if not key:  # end of input: nothing more will come
        time.sleep(timeout_s)
        return False
    return key.lower() == "q"


def top(
    name: Annotated[str, typer.Argument(help="Swarm name.")],
    once: Annotated[bool, typer.Option("--once", help="Print one look (two scrapes for the rates) and exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between looks.", min=0.1)] = 2.0,
    output: Annotated[OutputFormat, typer.Option("--output", "-o")] = OutputFormat.table,
) -> None:
    """Watch a swarm and its jobs: replica health, running/waiting requests, tok/s, KV cache; the LB's
    connections and requests (Slurm); job rows, rate, ETA."""
    sampler = TopSampler(name)
    if once:
        sampler.view()  # the first scrape: rates need two
        time.sleep(interval)
        doc = sampler.view()
        if output is OutputFormat.json:
            emit_json(doc)
        else:
            console.print(render(doc))
        return
    with _keys(), Live(render(sampler.view()), console=console, auto_refresh=False) as live:
        while not _quit_pressed(interval):
            live.update(render(sampler.view()), refresh=True)
