"""Identical requests sent once (per shard), and the response cache across jobs (prefect_swarm.jobs.dispatch.cache).

Requests are counted at the stub engine; its answers are a pure function of the request body, so a
run that sends every row is the reference the reused answers must match.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from _jobkit import MODEL, job_argv, requests, run_job, write_spec
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.holding import Holding
from prefect_swarm.jobs.dispatch.cache import (
    ResponseCache,
    cache_clear,
    cache_fields,
    cache_info,
    live_bytes,
    request_key,
)
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, cache_db, read_json
from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until

ANSWER_COLUMNS = ["id", "prompt", "status", "error", "text", "finish_reason"]


def dup_dataset(path: Path, n: int, unique: int, seed: int = 0) -> list[str]:
    """``n`` rows whose prompts take ``unique`` distinct values (each at least once), shuffled; the prompts."""
    rng = random.Random(seed)
    prompts = [f"question {i} about topic {i % 7}" for i in range(unique)]
    prompts += [rng.choice(prompts[:unique]) for _ in range(n - unique)]
    rng.shuffle(prompts)
    pq.write_table(pa.table({"id": [f"r{i:05d}" for i in range(n)], "prompt": prompts}), path, row_group_size=64)
    return prompts


def _out(tmp: Path, name: str) -> pa.Table:
    return pq.read_table(tmp / f"{name}-out.parquet")


def _progress(tmp: Path, name: str, shard: int = 0) -> dict:
    return read_json(JobPaths(tmp / name).shard(shard).progress)


def _run(tmp: Path, stub, name: str, **fields) -> tuple[int, pa.Table, dict]:
    """Run job ``name`` (one shard) to its end: (requests the stub got, output, progress)."""
    spec = write_spec(tmp, name, endpoints=[stub.url], **fields)
    before = requests(stub)
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    return requests(stub) - before, _out(tmp, name), _progress(tmp, name)


def _cached(tmp: Path, fingerprint: str = "engine-a", **more) -> dict:
    return {"cache": True, "cache_dir": str(tmp / "cache"), "swarm_fingerprint": fingerprint, **more}


def test_forty_percent_duplicates_send_sixty_percent_and_a_second_job_sends_none(tmp_path: Path, stub) -> None:
    n, unique = 250, 150  # 40 % of the rows repeat an earlier prompt
    dup_dataset(tmp_path / "in.parquet", n, unique)

    sent, ref, _ = _run(tmp_path, stub, "nocache", cache=False)
    assert sent == n  # --no-cache: every row its own request

    sent, first, progress = _run(tmp_path, stub, "first", **_cached(tmp_path))
    assert sent == unique == progress["requests"]
    assert progress["deduplicated"] == n - unique and progress["cache_hits"] == 0
    assert first.select(ANSWER_COLUMNS).equals(ref.select(ANSWER_COLUMNS))
    # tokens are counted once, on the row whose request was sent (every answer of the stub has some)
    reused = [r for r in first.to_pylist() if r["completion_tokens"] == 0]
    assert len(reused) == n - unique and all(r["prompt_tokens"] == 0 for r in reused)

    sent, second, progress = _run(tmp_path, stub, "second", **_cached(tmp_path))
    assert sent == 0 == progress["requests"]
    assert progress["cache_hits"] + progress["deduplicated"] == n and progress["cache_hits"] >= unique
    assert second.select(ANSWER_COLUMNS).equals(ref.select(ANSWER_COLUMNS))

    # another engine (fingerprint) shares nothing (--no-cache with a full cache: the CLI test below)
    sent, _, _ = _run(tmp_path, stub, "other-engine", **_cached(tmp_path, "engine-b"))
    assert sent == unique
    info = cache_info(tmp_path / "cache")
    assert info["entries"] == 2 * unique
    assert {f["fingerprint"]: f["entries"] for f in info["fingerprints"]} == {"engine-a": unique, "engine-b": unique}


def test_within_a_job_duplicates_are_deduplicated_without_the_cache(tmp_path: Path, stub) -> None:
    """The default (cache null, no cache folder): one request per distinct body, nothing written elsewhere."""
    dup_dataset(tmp_path / "in.parquet", 120, 30)
    sent, out, progress = _run(tmp_path, stub, "job")
    assert sent == 30 and progress["deduplicated"] == 90 and out.num_rows == 120
    assert set(out.column("status").to_pylist()) == {"ok"}


def test_a_refused_request_fails_every_row_that_asked_it_once(tmp_path: Path, stub) -> None:
    """A 400 answer is written to every row with that request; error answers are never cached."""
    dup_dataset(tmp_path / "in.parquet", 40, 10)
    bad = {"sampling": {"max_tokens": 8, "temperature": 5}}  # the stub, like an engine, refuses it
    sent, out, _ = _run(tmp_path, stub, "bad", job_kwargs=bad, max_failed_fraction=1.0, **_cached(tmp_path))
    assert sent == 10
    assert set(out.column("status").to_pylist()) == {"error"}
    assert all(e.startswith("HTTP 400") for e in out.column("error").to_pylist())
    assert cache_info(tmp_path / "cache")["entries"] == 0


def test_request_key_is_the_canonical_request() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    same = {"temperature": 0, "messages": [{"content": "hi", "role": "user"}], "model": "m"}
    assert request_key("fp", "/v1/chat/completions", body) == request_key("fp", "/v1/chat/completions", same)
    assert request_key("fp", "/v1/completions", body) != request_key("fp", "/v1/chat/completions", body)
    assert request_key("fp2", "/v1/chat/completions", body) != request_key("fp", "/v1/chat/completions", body)
    seeded = {**body, "seed": 1}
    assert request_key("fp", "/v1/chat/completions", seeded) != request_key("fp", "/v1/chat/completions", body)


def test_sigkill_mid_job_then_rerun_writes_each_row_exactly_once(tmp_path: Path, stub, stub_factory) -> None:
    n, unique = 3000, 1800
    dup_dataset(tmp_path / "in.parquet", n, unique, seed=3)
    _, ref, _ = _run(tmp_path, stub, "ref", cache=False)
    slow = stub_factory(latency_ms=20)  # the job outlasts the kill; answers do not depend on the latency
    spec = write_spec(
        tmp_path,
        "killed",
        endpoints=[slow.url],
        concurrency=16,
        checkpoint_every=100,
        checkpoint_seconds=0.3,
        **_cached(tmp_path),
    )
    shard = JobPaths(tmp_path / "killed").shard(0)
    proc = subprocess.Popen(job_argv(spec), stderr=subprocess.DEVNULL)
    wait_until(
        "300 rows done in the progress file",
        lambda: read_json(shard.progress)["done"],
        until=lambda done: done >= 300,
        timeout_s=60,
        poll_s=0.05,
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = read_json(shard.progress)["done"]
    assert 0 < done < n, done
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    got = _out(tmp_path, "killed")
    assert got.num_rows == n and len(set(got.column("id").to_pylist())) == n
    assert got.select(ANSWER_COLUMNS).equals(ref.select(ANSWER_COLUMNS))
    # the ledger holds each row once per write at most once past its latest: no row is in two states
    rows = [r for p in shard.parts() for r in pq.read_table(p, columns=["_row"]).column("_row").to_pylist()]
    assert sorted(set(rows)) == list(range(n))


def test_two_jobs_at_once_share_the_cache(tmp_path: Path, stub) -> None:
    """Two job processes read and write one cache together: both finish, with the same answers, and it
    holds each distinct request once."""
    dup_dataset(tmp_path / "in.parquet", 1500, 900, seed=5)
    specs = [write_spec(tmp_path, name, endpoints=[stub.url], **_cached(tmp_path)) for name in ("a", "b")]
    procs = [subprocess.Popen(job_argv(s), stderr=subprocess.PIPE, text=True) for s in specs]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    a, b = _out(tmp_path, "a"), _out(tmp_path, "b")
    assert a.select(ANSWER_COLUMNS).equals(b.select(ANSWER_COLUMNS)) and a.num_rows == 1500
    info = cache_info(tmp_path / "cache")
    assert info["entries"] == 900
    with sqlite3.connect(cache_db(tmp_path / "cache")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _writer(folder: str, start: int, count: int) -> None:
    cache = ResponseCache(Path(folder), "fp")
    for i in range(start, start + count):
        cache.put(i.to_bytes(16, "big"), f'{{"answer": {i}}}'.encode())
        if i % 50 == 0:
            cache.flush()
    cache.close()


def test_processes_writing_the_cache_at_once_keep_it_whole(tmp_path: Path) -> None:
    """Four processes insert overlapping keys in many short transactions: no error, every key once."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), k * 300, 600)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = ResponseCache(tmp_path, "fp")
    found = cache.get_many(i.to_bytes(16, "big") for i in range(1500))
    assert len(found) == 1500 and found[(1234).to_bytes(16, "big")] == b'{"answer": 1234}'
    cache.close()


def test_the_size_bound_drops_the_answers_used_least_recently(tmp_path: Path) -> None:
    bound = 256 * 1024
    cache = ResponseCache(tmp_path, "fp", max_bytes=bound)
    rng = random.Random(0)

    def key(i: int) -> bytes:
        return i.to_bytes(16, "big")

    for i in range(40):
        cache.put(key(i), rng.randbytes(2000).hex().encode())  # ~2 KB after compression
    cache.flush()
    for i in range(40, 400):
        if i % 40 == 0:
            assert len(cache.get_many([key(0)])) == 1  # key 0 stays in use
        cache.put(key(i), rng.randbytes(2000).hex().encode())
        if i % 20 == 0:
            cache.flush()
    cache.flush()
    assert live_bytes(cache.db) <= bound
    found = cache.get_many(key(i) for i in range(400))
    assert key(0) in found and key(399) in found  # used recently, stored last
    assert key(1) not in found and len(found) < 400  # the oldest unused ones went first
    cache.close()


def test_clear_empties_the_cache_or_one_engine(tmp_path: Path) -> None:
    for fp in ("a", "b"):
        cache = ResponseCache(tmp_path, fp)
        for i in range(10):
            cache.put(request_key(fp, "/v1/x", {"i": i}), b"{}")
        cache.close()
    assert cache_info(tmp_path)["entries"] == 20
    assert cache_clear(tmp_path, "a") == 10
    assert [f["fingerprint"] for f in cache_info(tmp_path)["fingerprints"]] == ["b"]
    assert cache_clear(tmp_path) == 10 and cache_info(tmp_path)["entries"] == 0
    assert cache_clear(tmp_path / "none") == 0 and not cache_info(tmp_path / "none")["exists"]


def test_a_damaged_cache_turns_itself_off_and_the_job_still_runs(tmp_path: Path, stub) -> None:
    (tmp_path / "cache").mkdir()
    cache_db(tmp_path / "cache").write_bytes(b"this is not a database" * 100)
    dup_dataset(tmp_path / "in.parquet", 40, 20)
    spec = write_spec(tmp_path, "job", endpoints=[stub.url], **_cached(tmp_path))
    before = requests(stub)
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    assert "response cache is off" in res.stderr
    assert requests(stub) - before == 20 and _out(tmp_path, "job").num_rows == 40


@pytest.mark.parametrize(
    ("env", "job_cache", "fingerprint", "on"),
    [
        ({}, None, "fp", False),
        ({"PREFECT_SWARM_CACHE": "1"}, None, "fp", True),
        ({"PREFECT_SWARM_CACHE": "1"}, False, "fp", False),
        ({}, True, "fp", True),
        ({}, True, None, False),  # no engine fingerprint: nothing to key the cache on
    ],
)
def test_submit_fills_the_cache_from_the_job_and_the_settings(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict,
    job_cache: bool | None,
    fingerprint: str | None,
    on: bool,
) -> None:
    for k in ("PREFECT_SWARM_CACHE", "PREFECT_SWARM_CACHE_DIR", "PREFECT_SWARM_CACHE_MAX_GB"):
        monkeypatch.delenv(k, raising=False)
    for k, v in {**env, "PREFECT_SWARM_HOME": str(tmp_path), "PREFECT_SWARM_CACHE_MAX_GB": "0.5"}.items():
        monkeypatch.setenv(k, v)
    spec = JobSpec(input="in.parquet", output="out.parquet", cache=job_cache, swarm_fingerprint=fingerprint)
    fields = cache_fields(spec)
    if on:
        assert fields == {"cache_dir": str(tmp_path / "cache"), "cache_max_bytes": 500_000_000}
    else:
        assert fields == {"cache_dir": None, "cache_max_bytes": None}
    assert os.environ["PREFECT_SWARM_HOME"] == str(tmp_path)


def test_cli_cache_and_no_cache_on_a_stub_swarm(tmp_path: Path, swarm_home: Path) -> None:
    """`job submit --cache` twice (the second sends nothing), `--no-cache` (sends every row), what `job status`
    says, `cache info` and `cache clear` through the real CLI on a local stub swarm (the default, identical
    rows sharing one request without the cache, is test_within_a_job_duplicates_are_deduplicated_...)."""

    def cli(*args: str) -> object:
        return CliRunner().invoke(app, list(args))

    n, unique = 100, 60
    dup_dataset(tmp_path / "in.parquet", n, unique, seed=9)
    config = tmp_path / "swarm.yaml"
    config.write_text(yaml.safe_dump(stub_swarm_config("cache-stub")))
    res = cli("up", "-c", str(config))  # a kept swarm: up to `down`, whatever the jobs on it
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    swarm = Holding().attach("cache-stub")
    try:

        def sent() -> int:
            return sum(
                int(httpx.get(u.removesuffix("/v1").rstrip("/") + "/stats", timeout=5).json()["requests"])
                for u in swarm.endpoints
            )

        def submit(out: str, *flags: str) -> tuple[int, str]:
            before = sent()
            argv = ["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / out), "--id-column", "id"]
            res = cli("job", "submit", "-n", "cache-stub", *argv, "--shards", "1", "--id", out, *flags)
            assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
            return sent() - before, res.output  # type: ignore[attr-defined]

        count, _ = submit("a.parquet", "--cache")
        assert count == unique
        count, shown = submit("b.parquet", "--cache")
        assert count == 0 and "rows answered without one" in shown and "from the response cache" in shown
        doc = json.loads(cli("job", "status", "b.parquet", "-o", "json").output)  # type: ignore[attr-defined]
        assert doc["progress"]["requests"] == 0 and doc["progress"]["cache_hits"] >= unique
        assert submit("c.parquet", "--no-cache")[0] == n
    finally:
        cli("down", "cache-stub", "-y")
    assert (
        pq.read_table(tmp_path / "b.parquet")
        .select(ANSWER_COLUMNS)
        .equals(pq.read_table(tmp_path / "c.parquet").select(ANSWER_COLUMNS))
    )
    info = json.loads(cli("cache", "info", "-o", "json").output)  # type: ignore[attr-defined]
    assert info["entries"] == unique and info["path"] == str(swarm_home / "cache" / "responses.db")
    assert info["fingerprints"][0]["fingerprint"] == swarm.fingerprint
    res = cli("cache", "clear", "-y")
    assert res.exit_code == 0 and f"dropped {unique}" in res.output  # type: ignore[attr-defined]
    assert json.loads(cli("cache", "info", "-o", "json").output)["entries"] == 0  # type: ignore[attr-defined]


def test_a_stored_answer_the_job_refuses_is_asked_again_and_replaced(tmp_path: Path, stub) -> None:
    prompts = dup_dataset(tmp_path / "in.parquet", 10, 10)
    body = {"messages": [{"role": "user", "content": prompts[0]}], "max_tokens": 8, "temperature": 0, "model": MODEL}
    key = request_key("engine-a", "/v1/chat/completions", body)
    cache = ResponseCache(tmp_path / "cache", "engine-a")
    cache.put(key, b'{"not": "an answer"}')  # e.g. stored by a job whose parse differs
    cache.close()
    sent, out, progress = _run(tmp_path, stub, "job", **_cached(tmp_path))
    assert sent == 10 and progress["cache_hits"] == 0
    assert out.column("text").to_pylist()[0].startswith("stub-")
    cache = ResponseCache(tmp_path / "cache", "engine-a")
    assert b"choices" in cache.get_many([key])[key]
    cache.close()


def test_the_flows_job_options_carry_the_cache_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """batch_inference's `job` options: `cache` is a run-form field; the cache folder is the flow's to fill."""
    from prefect_swarm.flows.params import JobOptions, job_options
    from prefect_swarm.launch import locate_job

    assert "cache" in JobOptions.model_fields and "cache_dir" not in JobOptions.model_fields
    dup_dataset(tmp_path / "in.parquet", 10, 5)
    for choice, folder in ((True, str(tmp_path / "home" / "cache")), (False, None)):
        monkeypatch.setenv("PREFECT_SWARM_HOME", str(tmp_path / "home"))
        spec = job_options({"job": "chat", "cache": choice}).to_spec(
            input=str(tmp_path / "in.parquet"), output=str(tmp_path / "out.parquet"), shards=1, swarm_fingerprint="fp"
        )
        assert locate_job(spec, "a-swarm").cache_dir == folder
