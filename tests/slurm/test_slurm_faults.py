"""Faults of a Slurm swarm's jobs: the LB job lost mid-job, a lost LB that may not be replaced,
and the allocation's end (the time limit). Real single-node Slurm, stub replicas, the CLI run as
its own process as a user would; every `prefect-swarm ...` hint the messages print is parsed with
the CLI's own parser (and the one that brings the swarm back is run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from _slurmkit import make_job, output_ids, stub_config
from hints import hint_commands, parse_command
from typer.testing import CliRunner

from prefect_swarm.backends.slurm import members, render
from prefect_swarm.backends.slurm.serving import SlurmServing
from prefect_swarm.cli.main import app
from prefect_swarm.config import SwarmConfig
from prefect_swarm.paths import SwarmPaths, atomic_write_json, read_json
from prefect_swarm.state import StateStore
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

Run = Callable[..., subprocess.CompletedProcess[str]]


def _json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))


def _up(run_cli: Run, cfg: SwarmConfig, tmp_path: Path) -> str:
    """`up -c` of ``cfg``; returns what it printed on stderr."""
    config = tmp_path / "swarm.yaml"
    config.write_text(yaml.safe_dump(cfg.redacted()))
    done = run_cli("up", "-c", str(config), "-o", "json", timeout=180)
    _json(done)
    return done.stderr


def _queue(name: str) -> dict[str, str]:
    """Job id -> state of the swarm's jobs named ``name`` (this user's)."""
    out = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%i %T"], capture_output=True, text=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _check_hints(*texts: str) -> list[list[str]]:
    """Every hint command in ``texts`` parses with the CLI's parser; returns them."""
    found = [argv for text in texts for argv in hint_commands(text)]
    for argv in found:
        parse_command(argv)  # raises the CLI's usage error for a hint that would not run
    return found


def _stub_ok(cfg: SwarmConfig, paths: SwarmPaths) -> int:
    """Completions the replicas accepted so far (the stub's own counter, read with the swarm's key)."""
    key = SlurmServing(cfg, paths).cfg.api_key
    headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
    total = 0
    for i in range(cfg.replicas):
        head = paths.replica_head(i).read_text().strip()
        total += int(httpx.get(f"http://{head}/stats", headers=headers, timeout=5).json()["ok"])
    return total


def _submissions(name: str, job_id: str) -> list[tuple[dict[str, Any], Any]]:
    """Every submission of the job (``job status`` shows the latest per shard) with the backend's probe of it."""
    from prefect_swarm.interfaces import JobHandle
    from prefect_swarm.state import StateStore
    from prefect_swarm.swarm import Swarm

    subs = (StateStore().require_job(job_id).handle or {})["submissions"]
    compute = Swarm.from_state(name).compute
    return [(sub, compute.probe(JobHandle.from_dict(sub))) for sub in subs]


def _allocation(sub: dict[str, Any]) -> str:
    return str(sub["meta"]["jobid"])


def _lb_ids(cfg: SwarmConfig) -> set[str]:
    return set(_queue(f"psw-{cfg.name}-lb"))


def test_a_lost_lb_is_replaced_and_a_job_it_stopped_ends_exactly_once(
    need_slurm: None, run_cli: Run, tmp_path: Path, swarm_home: Path
) -> None:
    cfg = stub_config(replicas=2, engine={"args": ["--latency-ms", "40"]})
    paths = render.swarm_paths(cfg, SwarmPaths.for_swarm(cfg.name))
    try:
        _up(run_cli, cfg, tmp_path)
        # 1. the LB job alone is lost: a replica task resubmits it, the swarm serves again
        first = _lb_ids(cfg)
        assert len(first) == 1, first
        subprocess.run(["scancel", *first], check=True)
        wait_until("the LB job left the queue", lambda: not (_lb_ids(cfg) & first), timeout_s=30)
        meanwhile = _json(run_cli("status", cfg.name, "-o", "json", "--no-history"))["status"]["detail"]
        second = wait_until("a new LB job", lambda: _lb_ids(cfg) - first, timeout_s=30)
        wait_until(
            "the swarm serves again",
            lambda: _json(run_cli("status", cfg.name, "-o", "json", "--no-history"))["status"]["phase"],
            until=lambda phase: phase == "RUNNING",
            timeout_s=90,
        )
        record = read_json(paths.slurm_record)
        assert record["resubmits"]["lb"] == 1 and record["lb_job"] in second, record
        _check_hints(meanwhile)

        # 2. the LB job is lost mid-job: the steps flush (PREEMPTED), the LB comes back, the job
        #    resumes and ends exactly once
        n, shards, concurrency = 3000, 2, 8
        spec = make_job(tmp_path, n, concurrency=concurrency, shards=shards, drain_seconds=1)
        before = _stub_ok(cfg, paths)
        cli = [sys.executable, "-m", "prefect_swarm.cli.main", "job", "submit", "-n", cfg.name, "--spec", str(spec)]
        proc = subprocess.Popen(
            [*cli, "--id", "lbjob", "--resubmit-on-preempt", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        parts = tmp_path / "job" / "shards"
        wait_until("both shards checkpointed", lambda: len(list(parts.glob("*/part-*.parquet"))) >= 2, timeout_s=60)
        lost = _lb_ids(cfg)
        subprocess.run(["scancel", *lost], check=True)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:] + err[-3000:]
        assert "preempted; resubmitting (1/2)" in err, err[-3000:]
        assert "(2/2)" not in err, err[-3000:]  # resumed once
        ids = output_ids(tmp_path)
        assert len(ids) == n and sorted(ids) == [f"r{i:05d}" for i in range(n)]
        status = _json(run_cli("job", "status", "lbjob", "--refresh", "-o", "json"))
        assert status["status"] == "SUCCEEDED"
        (sub1, stopped), (sub2, resumed) = _submissions(cfg.name, "lbjob")  # submitted, resumed once
        assert stopped.status.value == "PREEMPTED" and stopped.exit_code == 75, stopped
        assert resumed.status.value == "SUCCEEDED", resumed
        assert _allocation(sub1) in lost and _allocation(sub2) not in lost  # in the replaced LB's allocation
        # every completion the replicas accepted is a row, or one lost in flight when nginx went
        # (the shard retried it): at most shards x concurrency; the resume's readiness check sent one per replica
        extra = _stub_ok(cfg, paths) - before - n
        assert extra <= shards * concurrency + cfg.replicas, extra  # no resend beyond what was in flight
        _check_hints(err, stopped.detail or "")
    finally:
        run_cli("down", cfg.name, "-y", timeout=120)


def test_a_lost_lb_that_may_not_be_replaced_stops_the_swarm_and_says_why(
    need_slurm: None, run_cli: Run, tmp_path: Path, swarm_home: Path
) -> None:
    cfg = stub_config(replicas=1, engine={"args": ["--startup-delay-s", "6"]})
    paths = render.swarm_paths(cfg, SwarmPaths.for_swarm(cfg.name))
    try:
        said = _up(run_cli, cfg, tmp_path)
        # a slow start says what it waits for: the replica's watchdog status (issue 26, item 10)
        waits = ("replica 0 is not healthy yet: starting", "the LB has not announced itself", "waiting for")
        assert f"swarm '{cfg.name}' (" in said and any(w in said for w in waits), said  # what it waits for
        with members.locked(paths):  # its budget of replacements is spent
            record = read_json(paths.slurm_record)
            atomic_write_json(paths.slurm_record, {**record, "resubmits": {"lb": members.MAX_RESUBMITS}})
        subprocess.run(["scancel", *_lb_ids(cfg)], check=True)
        wait_until("the replicas are stopped too", lambda: not _queue(f"psw-{cfg.name}-replicas"), timeout_s=60)
        status = _json(run_cli("status", cfg.name, "-o", "json", "--no-history"))["status"]
        if status["phase"] != "STOPPED":  # the LB job may linger as COMPLETING a moment: it has ended
            assert status["phase"] == "FAILED" and status["detail"].startswith("stopping: "), status
            wait_until("the LB job leaves the queue", lambda: not _queue(f"psw-{cfg.name}-lb"), timeout_s=60)
            status = _json(run_cli("status", cfg.name, "-o", "json", "--no-history"))["status"]
        assert status["phase"] == "STOPPED", status
        assert "not replaced" in status["detail"] and "5 times" in status["detail"], status
        refused = run_cli("job", "submit", "-n", cfg.name, "--spec", str(make_job(tmp_path, 10)), timeout=60)
        assert refused.returncode == 4, refused.stderr[-2000:]
        leases = [x.owner for x in StateStore().list_leases(cfg.name)]
        assert not [owner for owner in leases if owner.startswith("job:")], leases  # a refused job holds nothing up
        hints = _check_hints(refused.stderr)
        again = next(argv for argv in hints if argv[0] == "up")
        assert again == ["up", "-c", str(SwarmPaths.for_swarm(cfg.name).config)], hints
        _json(run_cli(*again, "-o", "json", timeout=180))  # the hint runs: the swarm is back
        assert _json(run_cli("status", cfg.name, "-o", "json", "--no-history"))["status"]["phase"] == "RUNNING"
    finally:
        run_cli("down", cfg.name, "-y", timeout=120)


def test_the_time_limit_ends_a_job_preempted_and_it_resumes_in_a_new_allocation(
    need_slurm: None, run_cli: Run, tmp_path: Path, swarm_home: Path
) -> None:
    """time_limit 2 min, signal 20 s before it (Slurm sends it up to ~30-60 s early): the first
    allocation cannot finish the job, the steps flush at the signal (PREEMPTED, exit 75), and
    --resubmit-on-preempt waits for that allocation to end, brings the swarm up again (a new
    allocation) and resumes the job there; `job status` reads PREEMPTED meanwhile, never RUNNING."""
    cfg = stub_config(
        replicas=1,
        engine={"args": ["--latency-ms", "100"]},
        backend={"time_limit": "2", "signal_seconds": 20, "queue_timeout_s": 600},
    )
    n, shards, concurrency = 7600, 2, 4  # ~80 rows/s: 95 s of work
    try:
        _up(run_cli, cfg, tmp_path)
        first_lb = _lb_ids(cfg)
        spec = make_job(tmp_path, n, concurrency=concurrency, shards=shards, drain_seconds=1)
        cli = [sys.executable, "-m", "prefect_swarm.cli.main", "job", "submit", "-n", cfg.name, "--spec", str(spec)]
        started = time.monotonic()
        proc = subprocess.Popen(
            [*cli, "--id", "tl", "--resubmit-on-preempt", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        seen: list[str] = []
        while proc.poll() is None and time.monotonic() - started < 400:
            # `job status` in this process: a CLI process costs ~1 CPU-s, and this looks for 3 minutes
            doc = CliRunner().invoke(app, ["job", "status", "tl", "--refresh", "-o", "json"])
            if doc.exit_code == 0:
                state = json.loads(doc.stdout)["status"]
                if not seen or seen[-1] != state:
                    seen.append(state)
            time.sleep(3)  # the PREEMPTED gap lasts tens of seconds
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out[-3000:] + err[-3000:]
        assert "preempted; resubmitting (1/2)" in err, err[-3000:]
        after = seen[seen.index("PREEMPTED") :]  # the gap reads PREEMPTED, never a stale RUNNING
        assert after == ["PREEMPTED", "RUNNING", "SUCCEEDED"][: len(after)] and len(after) >= 2, seen
        ids = output_ids(tmp_path)
        assert len(ids) == n and sorted(ids) == [f"r{i:05d}" for i in range(n)]
        status = _json(run_cli("job", "status", "tl", "--refresh", "-o", "json"))
        assert status["status"] == "SUCCEEDED"
        subs = _submissions(cfg.name, "tl")
        assert subs[0][1].status.value == "PREEMPTED" and subs[0][1].exit_code == 75, subs
        assert subs[-1][1].status.value == "SUCCEEDED", subs
        allocations = [_allocation(sub) for sub, _ in subs]
        assert allocations[0] in first_lb and len(set(allocations)) == len(allocations), allocations
        _check_hints(err, subs[0][1].detail or "")
    finally:
        run_cli("down", cfg.name, "-y", timeout=120)


def test_an_idle_swarm_stops_itself_and_listens_only_in_its_port_range(
    need_slurm: None, run_cli: Run, tmp_path: Path, swarm_home: Path
) -> None:
    """backend.idle_timeout_s 20 and backend.port_range: the LB and the replica listen in the range
    (their preferred ports lie outside it); 30 s of requests keep the swarm up; 20 s without one stop
    it, replicas and LB, with the reason in `status`."""
    from prefect_swarm.testing import free_port_block

    base = free_port_block(10)
    cfg = stub_config(
        replicas=1, backend={"idle_timeout_s": 20, "idle_action": "stop", "port_range": f"{base}-{base + 9}"}
    )
    paths = render.swarm_paths(cfg, SwarmPaths.for_swarm(cfg.name))
    try:
        _up(run_cli, cfg, tmp_path)
        lb, replica = paths.lb_head.read_text().strip(), paths.replica_head(0).read_text().strip()
        for head in (lb, replica):
            assert base <= int(head.rsplit(":", 1)[1]) <= base + 9, (head, base)
        key = SlurmServing(cfg, paths).cfg.api_key
        headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
        body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        end = time.monotonic() + 30
        while time.monotonic() < end:  # busy for longer than the idle timeout
            assert httpx.post(f"http://{lb}/v1/chat/completions", json=body, headers=headers, timeout=10).is_success
            time.sleep(2)
        assert _lb_ids(cfg) and _queue(f"psw-{cfg.name}-replicas"), "stopped while in use"
        quiet = time.monotonic()
        wait_until(
            "the idle swarm left the queue",
            lambda: not _lb_ids(cfg) and not _queue(f"psw-{cfg.name}-replicas"),
            timeout_s=90,
        )
        assert time.monotonic() - quiet >= 20 - 5  # not before the timeout (counters are read every 5 s)
        status = _json(run_cli("status", cfg.name, "-o", "json", "--no-history"))["status"]
        assert status["phase"] == "STOPPED" and "idle_timeout_s" in status["detail"], status
    finally:
        run_cli("down", cfg.name, "-y", timeout=120)
