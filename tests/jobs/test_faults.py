"""The job process under faults: truncated bodies, a replica dying mid-job, a damaged input, chaos.

Every test runs real job processes against stub engines whose fault knobs inject the fault, and
counts requests at the stubs (and the job's own count in progress.json).
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, requests, run_job, write_spec

from prefect_swarm.jobs.dispatch.runner import EndpointPool
from prefect_swarm.paths import JobPaths, read_json

FAST_RETRIES = {"backoff_base_s": 0.01, "backoff_max_s": 0.05}


def _out(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _progress(tmp: Path, name: str = "job") -> dict:
    return read_json(JobPaths(tmp / name).shard(0).progress)


# ---------------------------------------------------------------- 5. truncated bodies


@pytest.mark.parametrize("knob", ["truncate_rate", "stall_body_rate"])
def test_cut_or_stalled_bodies_are_retried_not_failed(tmp_path: Path, stub_factory, knob: str) -> None:
    """A 200 whose body is cut (dropped connection) or stalls (read timeout) is a connection error: retried."""
    flaky = stub_factory(**{knob: 0.15}, seed=11)
    make_dataset(tmp_path / "in.parquet", 600)
    spec = write_spec(
        tmp_path, endpoints=[flaky.url], max_retries=6, request_timeout_s=0.5, concurrency=32, **FAST_RETRIES
    )
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    rows = _out(tmp_path / "job-out.parquet")
    assert len(rows) == 600 and all(r["status"] == "ok" and r["text"].startswith("stub-") for r in rows)
    stats = flaky.stats()
    faults = stats.get("truncated", 0) + stats.get("stalled", 0)
    assert faults > 30  # the knob fired...
    assert stats["requests"] == 600 + faults  # ...and each cut answer was sent again exactly once more


# ---------------------------------------------------------------- 6. dead replica


def test_dead_replica_is_ejected_and_its_rows_go_to_the_live_one(tmp_path: Path, stub_factory) -> None:
    """Two replicas, one dies mid-job for good: no row fails, the dead one gets only a few probes."""
    live = stub_factory(latency_ms=5)
    dying = stub_factory(latency_ms=5, exit_after=300)
    make_dataset(tmp_path / "in.parquet", 3000)
    spec = write_spec(tmp_path, endpoints=[dying.url, live.url], max_retries=2, concurrency=32, **FAST_RETRIES)
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    rows = _out(tmp_path / "job-out.parquet")
    assert [r["status"] for r in rows].count("ok") == 3000, [r["error"] for r in rows if r["error"]][:3]
    assert dying.proc is not None and dying.proc.poll() == 3  # it did die mid-job
    sent = _progress(tmp_path)["requests"]
    # resent: what was in flight on the dying replica, plus a handful of half-open probes
    assert 3000 <= sent <= 3000 + 32 + 20
    assert requests(live) >= 1500


def test_every_endpoint_gone_pauses_rows_then_stops_resumable(tmp_path: Path) -> None:
    """With every endpoint dead, rows wait for probes (no error row); past outage_timeout_s the shard
    flushes and exits 75, quickly, without hammering the dead endpoint."""
    from prefect_swarm.testing import free_port

    make_dataset(tmp_path / "in.parquet", 400)
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = write_spec(tmp_path, endpoints=[nobody], max_retries=2, concurrency=16, outage_timeout_s=1.5, **FAST_RETRIES)
    t0 = time.monotonic()
    res = run_job(spec)
    assert res.returncode == 75, res.stderr
    assert "no endpoint of the swarm answered" in res.stderr and "outage_timeout_s=1.5" in res.stderr
    assert not (tmp_path / "job-out.parquet").exists()
    progress = _progress(tmp_path)
    assert progress["state"] == "requeue" and progress["stopped"]["cause"] == "outage", progress
    assert progress["done"] == 0 and progress["failed"] == 0  # no row was written off for the outage
    assert progress["requests"] < 100  # the ejected endpoint is not hammered with every row's retries
    assert time.monotonic() - t0 < 30


def test_endpoint_pool_ejects_probes_and_readmits() -> None:
    """The circuit breaker: eject after N failures in a row, one half-open probe, readmit on an answer."""
    pool = EndpointPool(["http://a", "http://b"], eject_after=3, eject_base_s=0.05, eject_max_s=1)
    a, b = pool.endpoints
    for _ in range(2):
        assert pool.failed(a) is False
    assert pool.failed(a) is True and pool.in_rotation == 1
    assert {pool.acquire().url for _ in range(5)} == {"http://b"}  # type: ignore[union-attr]
    time.sleep(0.06)  # the point: the ejection (0.05 s) runs out on the clock, as the pool's backoff does
    probe = pool.acquire()
    assert probe is a and a.probing
    assert pool.acquire() is b  # one probe at a time
    assert pool.failed(a) is True  # the probe failed: out again, for twice as long
    assert [s for url, s in pool.ejection_log if url == "http://a"] == [0.05, 0.1]
    pool.failed(b), pool.failed(b), pool.failed(b)
    assert pool.acquire() is None and pool.out_for() >= 0
    time.sleep(0.11)  # the point: the doubled ejection (0.1 s) runs out
    probe = pool.acquire()
    assert probe is not None
    pool.answered(probe)
    assert pool.in_rotation == 1 and pool.out_for() == 0.0 and not probe.ejected_until


# ---------------------------------------------------------------- 4. damaged input


def _corrupt_row_group(path: Path, rg: int, column: str = "prompt") -> None:
    """Overwrite one column chunk of row group ``rg`` with garbage; the footer stays intact."""
    meta = pq.read_metadata(path)
    names = [meta.schema.column(j).path for j in range(meta.num_columns)]
    chunk = meta.row_group(rg).column(names.index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))


def test_damaged_row_group_is_reported_by_name_and_answers_are_kept(tmp_path: Path, stub) -> None:
    src = make_dataset(tmp_path / "in.parquet", 2000, row_group=400)
    _corrupt_row_group(src, 3)
    spec = write_spec(tmp_path, endpoints=[stub.url], concurrency=32, checkpoint_every=100_000)
    before = requests(stub)
    res = run_job(spec)
    assert res.returncode == 2, res.stderr
    assert f"input file {src}: row group 3 (rows 1200..1599) cannot be read" in res.stderr
    assert "deserialize" in res.stderr.lower()  # pyarrow's own words
    assert "missing from the ledger" not in res.stderr
    sent = requests(stub) - before
    assert sent == 1200  # rows before the damaged group; none after it
    shard = JobPaths(tmp_path / "job").shard(0)
    kept = sum(pq.read_metadata(p).num_rows for p in shard.parts())
    assert kept == sent  # every answer in flight when the read failed reached the ledger
    assert read_json(shard.progress)["state"] == "failed"
    assert not (tmp_path / "job-out.parquet").exists()


# ---------------------------------------------------------------- chaos


def test_chaos_every_row_ok_exactly_once_with_bounded_resends(tmp_path: Path, stub_factory) -> None:
    """3 replicas: one dies mid-job, truncated bodies, 429 storms with Retry-After, read timeouts."""
    common = {"latency_ms": 2, "truncate_rate": 0.10, "timeout_rate": 0.05, "retry_after_s": 0.05}
    replicas = [
        stub_factory(**common, seed=1, exit_after=400),
        stub_factory(**common, seed=2, storm_429_s=0.3, storm_429_period_s=1.0),
        stub_factory(**common, seed=3, storm_429_s=0.2, storm_429_period_s=0.7),
    ]
    n, conc = 4000, 48
    make_dataset(tmp_path / "in.parquet", n)
    spec = write_spec(
        tmp_path,
        endpoints=[r.url for r in replicas],
        concurrency=conc,
        max_retries=20,  # room for a busy CI machine: a slow answer there is a timeout too
        request_timeout_s=1.0,
        backoff_base_s=0.01,
        backoff_max_s=0.2,
        checkpoint_every=500,
    )
    res = run_job(spec, timeout=240)
    assert res.returncode == 0, res.stderr
    rows = _out(tmp_path / "job-out.parquet")
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(n)]  # exactly once, in order
    bad = [(r["id"], r["error"]) for r in rows if r["status"] != "ok" or not r["text"].startswith("stub-")]
    assert not bad, bad[:5]
    manifest = read_json(JobPaths(tmp_path / "job").manifest)
    assert manifest["ok"] == n and manifest["failed"] == 0
    assert replicas[0].proc is not None and replicas[0].proc.poll() == 3  # died mid-job
    live = [r.stats() for r in replicas[1:]]
    for kind in ("storm_429", "truncated", "timeouts"):  # every fault kind was injected
        assert sum(s.get(kind, 0) for s in live), live
    sent = _progress(tmp_path)["requests"]
    resent = sent - n
    faults_seen = sum(s.get("truncated", 0) + s.get("timeouts", 0) + s.get("429", 0) for s in live)
    # every resend is explained by a fault the live replicas injected, the dying replica's share
    # of faults (at most its 400 answers' worth), what was in flight when it died, and probes
    assert faults_seen <= resent <= faults_seen + 400 + conc + 20
    assert resent < 2 * n
