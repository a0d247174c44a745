"""Prefect API calls of a `batch_inference` run at 1 and 64 shards: what progress costs, flat in shards.

    python bench/prefect_api_calls.py [--shards 1 64] [--rows-per-shard 40] [--latency-ms 250]

Each shard gets the same rows (one request in flight, the stub at ``--latency-ms``), so every run's
shards last about as long. Every HTTP request this process sends to the Prefect API is counted (httpx's
``send``, which Prefect's clients use) with the time it was sent, and so is every event emitted. The
*shard phase* is ``run_shards``: from the shard tasks' submission to the last shard's end. Printed per
run: all calls; the calls each shard makes once (its task run's state events, its ``shard.completed``
event, its artifact created as it starts and updated as it ends); and the calls of the shard phase per
minute that are no shard's own (the job's progress artifact, log batches): the cost of progress, which
must not grow with the shards.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "prefect"))

from _common import dataset  # noqa: E402
from helpers import stub_swarm  # noqa: E402

CALLS: list[tuple[float, str]] = []
LOCK = threading.Lock()
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _count(request: Any) -> None:
    path = _ID.sub("{id}", request.url.path.split("/api", 1)[-1])
    kind = f"{request.method} {path}"
    if "/artifacts" in path and b" shard " in (request.content or b""):
        kind += " (a shard's)"  # its progress artifact: created as it starts, updated as it ends
    with LOCK:
        CALLS.append((time.monotonic(), kind))


def instrument() -> None:
    """Count every request of Prefect's httpx clients and every event emitted."""
    import httpx
    import prefect.events

    sync_send, async_send, emit = httpx.Client.send, httpx.AsyncClient.send, prefect.events.emit_event

    def send(self: Any, request: Any, **kw: Any) -> Any:
        _count(request)
        return sync_send(self, request, **kw)

    async def asend(self: Any, request: Any, **kw: Any) -> Any:
        _count(request)
        return await async_send(self, request, **kw)

    def emitted(*a: Any, **kw: Any) -> Any:
        with LOCK:
            CALLS.append((time.monotonic(), "EVENT " + str(kw.get("event", "?"))))
        return emit(*a, **kw)

    httpx.Client.send, httpx.AsyncClient.send, prefect.events.emit_event = send, asend, emitted  # type: ignore[method-assign]


class Marks:
    """When the run's shard phase (``run_shards``: the shards submitted, run and done) began and ended."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None

    def watch(self) -> None:
        import prefect_swarm.tasks.jobs as jobs

        real, marks = jobs.run_shards, self

        def timed(*a: Any, **kw: Any) -> Any:
            marks.start = time.monotonic()
            try:
                return real(*a, **kw)
            finally:
                marks.end = time.monotonic()

        jobs.run_shards = timed  # type: ignore[assignment]


def _shards_own(kind: str) -> bool:
    """A call one shard makes once: its task run's state events, its shard event, its own artifact."""
    once = ("EVENT prefect.task-run.", "EVENT prefect-swarm.job.shard.")
    return kind.startswith(once) or kind.endswith("(a shard's)")


def run(tmp: Path, shards: int, rows_per_shard: int, latency_ms: int, marks: Marks) -> dict[str, Any]:
    from prefect_swarm.flows import batch_inference

    src = dataset(tmp / f"in-{shards}.parquet", shards * rows_per_shard)
    opts = {"job": "chat", "id_column": "id", "concurrency": 1, "read_batch_rows": 64}
    cfg = stub_swarm(f"calls-{shards}", latency_ms=latency_ms)
    CALLS.clear()
    marks.start = marks.end = None
    t0 = time.monotonic()
    res = batch_inference(cfg, opts, str(src), str(tmp / f"out-{shards}.parquet"), shards=shards)
    wall = time.monotonic() - t0
    assert res["ok"] == res["rows"], res
    assert marks.start is not None and marks.end is not None
    phase = [kind for t, kind in CALLS if marks.start <= t <= marks.end]
    per_shard = sum(1 for _, kind in CALLS if _shards_own(kind)) / shards
    steady = [k for k in phase if not _shards_own(k)]
    minutes = (marks.end - marks.start) / 60.0
    return {
        "shards": shards,
        "rows": res["rows"],
        "wall_s": round(wall, 1),
        "phase_s": round(marks.end - marks.start, 1),
        "calls": len(CALLS),
        "per_shard": round(per_shard, 1),
        "steady_per_min": round(len(steady) / minutes, 1),
        "kinds": collections.Counter(steady).most_common(6),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--rows-per-shard", type=int, default=40)
    ap.add_argument("--latency-ms", type=int, default=250)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="api-calls-"))
    os.environ["PREFECT_SWARM_HOME"] = str(tmp / "home")
    from prefect.testing.utilities import prefect_test_harness

    instrument()
    marks = Marks()
    marks.watch()
    print("| shards | rows | wall s | shard phase s | API calls + events | one-time per shard | progress calls/min |")
    print("|---|---|---|---|---|---|---|")
    with prefect_test_harness(server_startup_timeout=90):
        for n in a.shards:
            r = run(tmp, n, a.rows_per_shard, a.latency_ms, marks)
            print(
                f"| {r['shards']} | {r['rows']} | {r['wall_s']} | {r['phase_s']} | {r['calls']} | {r['per_shard']} "
                f"| {r['steady_per_min']} |"
            )
            print(f"  shard phase, not per shard: {r['kinds']}", file=sys.stderr)


if __name__ == "__main__":
    main()
