"""The `prefect-swarm job` commands under misuse and faults, through the real CLI and a local stub swarm.

A refused resubmit changes nothing; `job retry` follows the swarm as it is now; a resubmit of a
running job attaches; exit codes and statuses follow the failed fraction (max_failed_fraction).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, write_spec
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.config import SwarmConfig
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.launch import record_job
from prefect_swarm.paths import JobPaths, read_json
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine, stub_swarm_config
from prefect_swarm.testing.waiting import wait_until

SAMPLING = '{"sampling": {"max_tokens": 4}}'


def _swarm(name: str = "cli-stub", *, replicas: int = 1, port: int | None = None, **knobs: Any) -> Swarm:
    return Swarm(SwarmConfig.model_validate(stub_swarm_config(name, replicas=replicas, port=port, **knobs)))


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _requests(swarm: Swarm) -> int:
    return sum(
        int(httpx.get(u.removesuffix("/v1").rstrip("/") + "/stats", timeout=5).json().get("requests", 0))
        for u in swarm.endpoints
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _submit(tmp: Path, *extra: str, swarm: str = "cli-stub") -> Any:
    return _cli(
        "job",
        "submit",
        "-n",
        swarm,
        "--input",
        str(tmp / "in.parquet"),
        "--output",
        str(tmp / "out.parquet"),
        "--id-column",
        "id",
        *extra,
    )


def test_refused_resubmit_prints_why_exits_2_and_changes_nothing(tmp_path: Path) -> None:
    make_dataset(tmp_path / "in.parquet", 300)
    with _swarm():
        res = _submit(tmp_path, "--id", "j7", "--job-kwargs", SAMPLING)
        assert res.exit_code == 0, res.output
        rec = StateStore().require_job("j7")
        paths = JobPaths(Path(rec.job_dir or ""))
        before = (paths.spec.read_bytes(), _sha(tmp_path / "out.parquet"), rec, _sha(paths.manifest))

        res = _submit(tmp_path, "--id", "j7", "--job-kwargs", '{"sampling": {"max_tokens": 9}}')
        assert res.exit_code == 2, res.output
        assert "refusing to resume shard 0" in res.output and "max_tokens" in res.output
        assert "--overwrite" in res.output
        after = (paths.spec.read_bytes(), _sha(tmp_path / "out.parquet"), None, _sha(paths.manifest))
        assert after[0] == before[0] and after[1] == before[1] and after[3] == before[3]
        assert StateStore().require_job("j7") == before[2]
        res = _cli("job", "status", "j7", "-o", "json")
        doc = json.loads(res.stdout)
        assert doc["status"] == "SUCCEEDED" and doc["committed"] and doc["verdict"]["failed"] == 0


def test_retry_follows_the_swarm_refuses_a_changed_engine_and_never_fakes_success(tmp_path: Path) -> None:
    n = 120
    make_dataset(tmp_path / "in.parquet", n)
    first = _swarm("moving")
    with first:
        fingerprint = first.fingerprint
    # The job ran against a broken engine: every row failed (HTTP 500, retries spent; an outage would
    # have paused the rows, not failed them) ...
    with StubEngine(free_port(), error_rate=1.0) as broken:
        spec_path = write_spec(
            tmp_path,
            "job",
            job_id="j8",
            swarm="moving",
            endpoints=[broken.url],
            swarm_fingerprint=fingerprint,
            max_retries=0,
            concurrency=8,
            output=str(tmp_path / "out.parquet"),
        )
        spec = JobSpec.load(spec_path)
        record_job(spec)
        res = subprocess.run(
            [sys.executable, "-m", "prefect_swarm.jobs.run", "--spec", str(spec_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert res.returncode == 0, res.stderr
    doc = json.loads(_cli("job", "status", "j8", "-o", "json").stdout)
    assert doc["verdict"]["failed"] == n
    # why, where a CLI user looks: the reasons with counts and an example row with the engine's words
    reasons = {r["reason"]: r["rows"] for r in doc["failure_reasons"]["reasons"]}
    assert set(reasons) == {"HTTP 500", "HTTP 503"} and sum(reasons.values()) == n, doc["failure_reasons"]
    shown = _cli("job", "status", "j8").stdout
    assert "Why: HTTP 50" in shown and shown.count('{"error":{"message":"injected failure"}}') == 2, shown

    # ... then it came back on another port: retry reaches it, and only the failed rows are sent
    with _swarm("moving") as back:
        assert back.fingerprint == fingerprint
        sent = _requests(back)  # the readiness probe's
        res = _cli("job", "retry", "j8")
        assert res.exit_code == 0, res.output
        assert f"{n} rows: {n} ok, 0 failed" in res.output
        assert _requests(back) - sent == n
    doc = json.loads(_cli("job", "status", "j8", "-o", "json").stdout)
    assert doc["status"] == "SUCCEEDED" and doc["verdict"]["succeeded"]
    out_sha = _sha(tmp_path / "out.parquet")

    # another engine behind the same name: refused (nothing sent, nothing changed) unless --overwrite
    with _swarm("moving", latency_ms=2) as swapped:
        assert swapped.fingerprint != fingerprint
        sent = _requests(swapped)
        res = _cli("job", "retry", "j8")
        assert res.exit_code == 2, res.output
        assert "swarm_fingerprint" in res.output and "job retry ID --overwrite" in res.output
        assert _requests(swapped) == sent and _sha(tmp_path / "out.parquet") == out_sha
        res = _cli("job", "retry", "j8", "--overwrite")
        assert res.exit_code == 0, res.output
        assert _requests(swapped) - sent == n
    assert pq.read_table(tmp_path / "out.parquet").column("status").to_pylist() == ["ok"] * n


def _null_prompts(path: Path, n: int, every: int) -> None:
    prompts = [None if i % every == 0 else f"question {i}" for i in range(n)]
    pq.write_table(pa.table({"id": [f"r{i:04d}" for i in range(n)], "prompt": prompts}), path)


def test_exit_code_and_status_follow_the_failed_fraction(tmp_path: Path) -> None:
    _null_prompts(tmp_path / "in.parquet", 200, every=10)  # 20 rows (10%) can never succeed
    with _swarm():
        res = _submit(tmp_path, "--id", "j10", "--job-kwargs", SAMPLING)
        assert res.exit_code == 1, res.output
        failed_rows = str(JobPaths(Path(StateStore().require_job("j10").job_dir or "")).failed_rows)
        assert "200 rows: 180 ok, 20 failed (10.00%)" in res.output and "max_failed_fraction 0.01" in res.output
        assert failed_rows in res.output.replace("\n", "")
        doc = json.loads(_cli("job", "status", "j10", "-o", "json").stdout)
        assert doc["status"] == "FAILED" and doc["committed"]
        assert doc["verdict"]["succeeded"] is False and doc["verdict"]["failed"] == 20
        assert doc["verdict"]["failed_rows"] == failed_rows

        # retrying cannot help these rows: never reported as a success
        res = _cli("job", "retry", "j10")
        assert res.exit_code == 1, res.output
        assert "20 failed" in res.output
        res = _cli("job", "wait", "j10")
        assert res.exit_code == 1 and "20 failed" in res.output

        # within the threshold: exit 0, the counts still printed
        res = _cli(
            "job", "submit", "-n", "cli-stub", "--input", str(tmp_path / "in.parquet"), "--output",
            str(tmp_path / "out2.parquet"), "--id-column", "id", "--id", "j10b", "--max-failed-fraction", "0.2",
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        assert "200 rows: 180 ok, 20 failed" in res.output and "within max_failed_fraction 0.2" in res.output
        doc = json.loads(_cli("job", "status", "j10b", "-o", "json").stdout)
        assert doc["status"] == "SUCCEEDED" and doc["verdict"]["succeeded"]


def test_submit_detach_twice_attaches_instead_of_starting_twice(tmp_path: Path) -> None:
    n = 1200
    make_dataset(tmp_path / "in.parquet", n)
    with _swarm(latency_ms=20) as swarm:
        sent = _requests(swarm)  # the readiness probe's
        args = ("--id", "j9", "--shards", "2", "--concurrency", "4", "--job-kwargs", SAMPLING, "--detach")
        res = _submit(tmp_path, *args)
        assert res.exit_code == 0, res.output
        res = _submit(tmp_path, *args)  # 1,200 rows at 8 x 20 ms take > 3 s: still running
        assert res.exit_code == 0, res.output
        assert "attached" in res.output and "nothing new was started" in res.output
        rec = StateStore().require_job("j9")
        assert len(rec.handle["submissions"]) == 1
        res = _cli("job", "wait", "j9")
        assert res.exit_code == 0, res.output
        assert _requests(swarm) - sent == n
    assert read_json(JobPaths(Path(rec.job_dir or "")).manifest)["ok"] == n


def test_a_shard_stopped_by_a_signal_is_preempted_resumable_and_resumes_exactly_once(tmp_path: Path) -> None:
    """A SIGTERM that is not our cancel (a scheduler's preemption, an OOM-reaper, a time limit): the
    shard flushes and exits 75; the job reads PREEMPTED, `job wait` exits 75 and says how to resume;
    the same submit resumes it and every row is answered once."""
    import os
    import signal

    n = 1500
    make_dataset(tmp_path / "in.parquet", n)
    with _swarm(latency_ms=20) as swarm:
        sent = _requests(swarm)
        args = ("--id", "pre", "--shards", "1", "--concurrency", "4", "--job-kwargs", SAMPLING)
        res = _submit(tmp_path, *args, "--detach")
        assert res.exit_code == 0, res.output
        shard = StateStore().require_job("pre").handle["submissions"][0]["meta"]["shards"][0]
        wait_until(
            "100 requests sent", lambda: _requests(swarm) - sent, until=lambda k: k >= 100, timeout_s=30, poll_s=0.1
        )
        os.kill(shard["pid"], signal.SIGTERM)  # the exit-code wrapper forwards it to the job process
        res = _cli("job", "wait", "pre")
        assert res.exit_code == 75, res.output
        assert "PREEMPTED" in res.output and "resumable" in res.output and "--id pre" in res.output
        doc = json.loads(_cli("job", "status", "pre", "-o", "json").output)
        assert doc["status"] == "PREEMPTED" and not doc["committed"], {k: doc[k] for k in ("status", "backend")}
        done_before = doc["progress"]["done"]
        assert 0 < done_before < n, doc["progress"]
        res = _submit(tmp_path, *args)
        assert res.exit_code == 0, res.output
        assert _requests(swarm) - sent == n  # resumed: no row sent twice
    table = pq.read_table(tmp_path / "out.parquet")
    assert sorted(table.column("id").to_pylist()) == sorted(
        pq.read_table(tmp_path / "in.parquet").column("id").to_pylist()
    )


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ('{"samples": 100000}', "samples is 100000, more than the 128 answers one row may ask for"),
        ('{"sampling": {"n": 1000000}}', "sampling.n is 1000000, more than the 128 answers"),
        ('{"samples": 64, "sampling": {"max_tokens": 100000}}', "sampling.max_tokens x samples is 100,000 x 64"),
        ('{"sampling": {"n": 8, "max_completion_tokens": 1000000}}', "sampling.max_completion_tokens x sampling.n"),
    ],
)
def test_a_row_asking_too_much_is_refused_before_any_request(tmp_path: Path, kwargs: str, says: str) -> None:
    """`samples: 100000` and friends on a 1-row input: exit 2 naming the field, and the engine never asked."""
    make_dataset(tmp_path / "in.parquet", 1)
    with _swarm() as swarm:
        before = _requests(swarm)  # the readiness probe's
        res = _submit(tmp_path, "--id", "j-many", "--job-kwargs", kwargs)
        assert res.exit_code == 2, res.output
        assert says in res.output
        assert _requests(swarm) == before
        assert not (tmp_path / "out.parquet").exists()
