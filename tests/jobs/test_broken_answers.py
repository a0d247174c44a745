"""A 200 whose body is broken ends its row (issue 40, item 0).

An engine answers some rows, on every try, with a 200 whose body cannot be used: an HTML page, an
empty body, JSON without ``choices``, JSON cut in half, a JSON array, or a body cut by a dropped
connection (its ``Content-Length`` announces the whole answer, 16 bytes come, then the connection
closes). Each such row ends as an error row naming what was wrong, within its retries; every other
row is answered; each row is in the output exactly once; the shards exit as done (0) and the commit
counts the error rows. The stub engine's ``--broken-prompt``/``--broken-form`` knobs break the
answers; every wait is on the job processes' exit, each bounded so a hang fails the test.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from _jobkit import job_argv, make_dataset, write_spec

from prefect_swarm.interfaces.jobenv import EXIT_OK
from prefect_swarm.jobs.rows.commit import manifest_verdict
from prefect_swarm.paths import JobPaths, read_json
from prefect_swarm.testing.stub_engine import BROKEN_FORMS

N, SHARDS = 400, 2
BROKEN = r"^question number \d*9 "
"""Rows 9, 19, ..., 399 (the last row of each shard among them): their every answer is broken."""
KNOBS = {
    "max_retries": 2,
    "request_timeout_s": 5,
    "backoff_base_s": 0.01,
    "backoff_max_s": 0.05,
    "concurrency": 32,
    "checkpoint_every": 50,
}
ENDS_WITHIN_S = 60
"""How long a job of 400 rows against a local stub may take (seconds, on a busy machine): it hung for good."""
WHY = {
    "html": ("unparsable response: not JSON: JSONDecodeError", "502 Bad Gateway"),
    "empty": ("unparsable response: empty body",),
    "no-choices": ("unparsable response: KeyError: 'choices'", '"usage"'),
    "truncated-json": ("unparsable response: not JSON: JSONDecodeError",),
    "array": ("unparsable response: a JSON array, not an object",),
    "cut": (
        f"gave up after {KNOBS['max_retries'] + 1} attempts; last: HTTP 200 answer cut short (Content-Length ",
        "ClientPayloadError",
    ),
}
"""What each broken row's error says (all of it, in this order)."""


def _ids(rows: range) -> list[str]:
    return [f"r{i:06d}" for i in rows]


def _broken(n: int) -> set[str]:
    return {f"r{i:06d}" for i in range(n) if re.search(BROKEN, f"question number {i} about topic {i % 17}")}


def _run_to_the_end(spec: Path, nshards: int, health_url: str | None = None) -> list[int]:
    """Run every shard of the job at once until each process exits (within :data:`ENDS_WITHIN_S`, else the
    test fails with their progress files); with ``health_url``, its /health must answer 200 meanwhile."""
    procs = [
        subprocess.Popen(job_argv(spec, i, nshards), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for i in range(nshards)
    ]
    deadline = time.monotonic() + ENDS_WITHIN_S
    try:
        while running := [p for p in procs if p.poll() is None]:
            left = deadline - time.monotonic()
            if left <= 0:
                progress = [read_json(JobPaths(spec.parent).shard(i).progress) for i in range(nshards)]
                pytest.fail(f"the job did not end within {ENDS_WITHIN_S}s: {progress}")
            if health_url is not None:
                assert httpx.get(health_url + "/health", timeout=5).status_code == 200
            # wait on the process's exit; with a /health to watch, look at it again every half second
            with contextlib.suppress(subprocess.TimeoutExpired):
                running[0].wait(timeout=min(left, 0.5) if health_url is not None else left)
        return [p.returncode for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            _, err = p.communicate()
            if p.returncode not in (EXIT_OK, None):
                print(err)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("form", BROKEN_FORMS)
def test_a_row_whose_every_answer_is_broken_ends_as_an_error_row_naming_why(
    tmp_path: Path, stub_factory, form: str
) -> None:
    engine = stub_factory(broken_prompt=BROKEN, broken_form=form)
    make_dataset(tmp_path / "in.parquet", N)
    spec = write_spec(tmp_path, endpoints=[engine.url], shards=SHARDS, **KNOBS)

    assert _run_to_the_end(spec, SHARDS) == [EXIT_OK] * SHARDS
    rows = pq.read_table(tmp_path / "job-out.parquet", columns=["id", "status", "error"]).to_pylist()
    assert [r["id"] for r in rows] == _ids(range(N))  # every row exactly once, in order
    broken = _broken(N)
    assert len(broken) == 40
    assert {r["id"] for r in rows if r["status"] != "ok"} == broken
    tries = KNOBS["max_retries"] + 1 if form == "cut" else 1  # a cut body is retried; an unusable one is final
    for r in rows:
        if r["id"] in broken:
            assert r["error"] and re.search(".*".join(map(re.escape, WHY[form])), r["error"]), r
        else:
            assert r["error"] is None, r
    stats = engine.stats()
    assert stats["broken"] == 40 * tries and stats["requests"] == N - 40 + 40 * tries  # each row tried that often
    manifest = read_json(JobPaths(tmp_path / "job").manifest)
    assert (manifest["rows"], manifest["ok"], manifest["failed"]) == (N, N - 40, 40)
    assert not manifest_verdict(manifest, 0.01).succeeded  # the job counts them: 10 % failed is above its 1 %
    for i in range(SHARDS):
        progress = read_json(JobPaths(tmp_path / "job").shard(i).progress)
        assert (progress["state"], progress["done"], progress["failed"]) == ("done", N // SHARDS, 20), progress


@pytest.mark.timeout(120)
def test_a_row_whose_every_answer_is_cut_ends_while_the_engine_stays_healthy(tmp_path: Path, stub_factory) -> None:
    """One row, the last, is always cut mid-body while /health stays 200 and every other row is answered:
    at the end it is the only request left, so nothing else answers between its tries; it still spends its
    retries (the engine answered it each time: its headers came) and ends an error row; nothing waits on
    an outage that is not there."""
    engine = stub_factory(broken_prompt=f"^question number {N - 1} ", broken_form="cut")
    make_dataset(tmp_path / "in.parquet", N)
    spec = write_spec(tmp_path, endpoints=[engine.url], **KNOBS)

    assert _run_to_the_end(spec, 1, health_url=engine.url) == [EXIT_OK]
    rows = pq.read_table(tmp_path / "job-out.parquet", columns=["id", "status", "error"]).to_pylist()
    assert [r["id"] for r in rows] == _ids(range(N))
    assert [r["status"] for r in rows].count("ok") == N - 1
    last = rows[-1]
    assert last["status"] == "error", last
    assert f"gave up after {KNOBS['max_retries'] + 1} attempts; last: HTTP 200 answer cut short" in last["error"], last
    assert engine.stats()["broken"] == KNOBS["max_retries"] + 1


def test_a_body_cut_after_its_headers_is_the_rows_failure_even_in_an_outage() -> None:
    """The rule, on the runner's own bookkeeping: a request whose status line and headers came before its
    body broke was answered. It counts against the row's retries and keeps (or brings back) its endpoint
    in rotation, whether or not anything else answered since, and whether or not every endpoint is out."""
    from prefect_swarm.jobs.builtin import ChatCompletionJob
    from prefect_swarm.jobs.dispatch.runner import Runner, RunnerConfig

    runner = Runner(ChatCompletionJob(), ["http://a"], RunnerConfig(eject_after=2), lambda _r: None)
    pool = runner.pool
    (a,) = pool.endpoints
    sent = time.monotonic()
    assert runner._no_answer(a, sent, head_at=time.monotonic()) == (True, False)  # nothing else answered: counted
    assert a.fails == 0 and pool.in_rotation == 1
    for _ in range(2):
        runner._no_answer(a, time.monotonic())  # no answer at all, twice: a is ejected, the swarm is out
    assert pool.in_rotation == 0 and pool.out_for() >= 0
    a.probing = True  # a probe's headers come, then its body is cut: a is alive, the row's try counted
    assert runner._no_answer(a, time.monotonic(), head_at=time.monotonic()) == (True, False)
    assert pool.in_rotation == 1 and pool.out_for() == 0.0 and not a.ejected_until and not a.probing
