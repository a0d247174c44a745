"""Keeping a Slurm swarm alive on a shared cluster: reconcile instead of restart, replace dead
replicas, scale without restarts, safe ports, signals, honest status. Real single-node Slurm,
stub replicas."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from _slurmkit import (
    LiveSwarm,
    job_command,
    make_job,
    nginx_locations,
    our_jobs,
    output_ids,
    refused_without_key,
    stub_config,
)

from prefect_swarm.backends.slurm import members
from prefect_swarm.backends.slurm.client import SlurmClient
from prefect_swarm.backends.slurm.compute import SlurmCompute
from prefect_swarm.interfaces import JobRequest, JobStatus, ReplicaHealth, ServingPhase
from prefect_swarm.paths import JobPaths, atomic_write_json, read_json
from prefect_swarm.testing.stub_engine import ROUTES
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

MakeSwarm = Callable[..., LiveSwarm]


def task_ids(swarm: LiveSwarm) -> list[str | None]:
    """Slurm task id (``123_0``) serving each replica, from status."""
    assert swarm.handle is not None
    return [r.external_id for r in swarm.serving.status(swarm.handle).replicas]


def wait_healthy(swarm: LiveSwarm, n: int, timeout_s: float = 90) -> None:
    handle = swarm.handle
    assert handle is not None
    wait_until(
        f"{n} healthy replicas, RUNNING",
        lambda: swarm.serving.status(handle),
        until=lambda st: st.healthy == n and st.phase is ServingPhase.RUNNING,
        timeout_s=timeout_s,
        poll_s=0.5,
    )


def lb_job_id(swarm: LiveSwarm) -> str:
    out = subprocess.run(["squeue", "-h", "-n", swarm.serving.names.lb, "-o", "%i"], capture_output=True, text=True)
    return out.stdout.strip()


def no_failed_rows(job_dir: Path) -> None:
    failed = JobPaths(job_dir).failed_rows
    assert not failed.exists() or not failed.read_text().strip(), failed.read_text()


def test_a_replica_cancelled_mid_job_is_replaced_and_no_row_fails(slurm_swarm: MakeSwarm, tmp_path: Path) -> None:
    swarm = slurm_swarm(stub_config(replicas=3, engine={"args": ["--latency-ms", "20"]}))
    handle = swarm.up()
    before, lb = task_ids(swarm), lb_job_id(swarm)
    spec = make_job(tmp_path, 1500, concurrency=8, shards=4)
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=4))
    wait_until(
        "the job RUNNING", lambda: compute.probe(job).status, until=lambda s: s is JobStatus.RUNNING, timeout_s=60
    )
    SlurmClient().scancel([str(before[1])])
    assert compute.wait(job, poll_s=0.5) is JobStatus.SUCCEEDED, compute.probe(job)
    assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(1500)]
    no_failed_rows(tmp_path / "job")
    wait_healthy(swarm, 3)  # the LB's reconciler resubmitted task 1 on its own
    after = task_ids(swarm)
    assert after[0] == before[0] and after[2] == before[2], (before, after)
    assert after[1] != before[1] and str(after[1]).endswith("_1"), (before, after)
    assert lb_job_id(swarm) == lb
    wait_until(  # the LB follows the head files within its reconcile interval
        "3 servers in the LB's upstream file", lambda: routed(swarm), until=lambda n: n == 3, timeout_s=15, poll_s=0.3
    )


def routed(swarm: LiveSwarm) -> int:
    """Servers in the LB's upstream file."""
    return len(re.findall(r"^server ", swarm.paths.upstreams.read_text(), re.M))


def test_up_of_a_degraded_swarm_resubmits_only_the_missing_task(slurm_swarm: MakeSwarm) -> None:
    swarm = slurm_swarm(stub_config(replicas=3))
    swarm.up()
    before, lb = task_ids(swarm), lb_job_id(swarm)
    SlurmClient().scancel([str(before[2])])
    wait_until(
        f"task {before[2]} to leave the queue",
        lambda: our_jobs(swarm.cfg),
        until=lambda jobs: str(before[2]) not in jobs,
        timeout_s=15,
    )
    swarm.up()  # reconciles (whoever resubmits first, `up` or the LB's reconciler, nothing is doubled)
    wait_healthy(swarm, 3)
    after = task_ids(swarm)
    assert after[:2] == before[:2] and after[2] != before[2]
    assert lb_job_id(swarm) == lb
    assert len(our_jobs(swarm.cfg).splitlines()) == 4, our_jobs(swarm.cfg)  # 3 tasks + the LB


def test_scale_up_and_down_keeps_the_running_replicas(slurm_swarm: MakeSwarm, tmp_path: Path) -> None:
    cfg = stub_config(replicas=2, engine={"args": ["--latency-ms", "40"]})
    swarm = slurm_swarm(cfg)
    handle = swarm.up()
    first, lb = task_ids(swarm), lb_job_id(swarm)
    spec = make_job(tmp_path, 3000, concurrency=4, shards=2)  # ~15 s of work at 40 ms per request
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=2))
    error_log = swarm.serving.paths.lb_error_log
    seen = error_log.stat().st_size  # from here on: what scaling did
    # its steps may wait a moment for Slurm on a loaded machine: scaling starts once they run
    wait_until(
        "the job past PENDING",
        lambda: compute.probe(job),
        until=lambda p: p.status is not JobStatus.PENDING,
        timeout_s=60,
    )
    for n in (4, 2):
        assert compute.probe(job).status is JobStatus.RUNNING, "scaling happens during the job"
        swarm.cfg = cfg.model_copy(update={"replicas": n})
        swarm.up()
        assert task_ids(swarm)[:2] == first, "the original replicas keep their job ids"
        assert lb_job_id(swarm) == lb
        wait_healthy(swarm, n)
    assert compute.wait(job, poll_s=0.5) is JobStatus.SUCCEEDED, compute.probe(job)
    assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(3000)]
    no_failed_rows(tmp_path / "job")
    scaling = error_log.read_bytes()[seen:].decode(errors="replace")
    assert "no live upstreams" not in scaling
    assert "prematurely closed" not in scaling, "a replica was stopped with requests in flight"
    wait_until(  # a cancelled task may linger in squeue as COMPLETING for a moment
        "3 jobs of ours in the queue",
        lambda: our_jobs(swarm.cfg),
        until=lambda jobs: len(jobs.splitlines()) == 3,
        timeout_s=30,
        poll_s=0.5,
    )


def nginx_of(swarm: LiveSwarm) -> list[str]:
    """Processes whose command line names this swarm's nginx.conf."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(swarm.serving.paths.nginx_conf) in line and "nginx" in line]


@pytest.mark.parametrize("how", ["usr1-full", "plain"])
def test_no_nginx_outlives_the_lb_job(slurm_swarm: MakeSwarm, how: str) -> None:
    swarm = slurm_swarm(stub_config(replicas=1))
    swarm.up()
    assert nginx_of(swarm)
    lb = lb_job_id(swarm)
    paths = swarm.serving.paths
    with members.locked(paths):  # a lost LB is replaced (tests/slurm/test_slurm_faults.py): not this one
        record = read_json(paths.slurm_record)
        atomic_write_json(paths.slurm_record, {**record, "resubmits": {"lb": members.MAX_RESUBMITS}})
    if how == "usr1-full":  # the batch shell and every step get USR1 (nginx alone would reopen its logs)
        subprocess.run(["scancel", "--signal=USR1", "--full", lb], check=True)
    else:
        SlurmClient().scancel([lb])
    wait_until(
        "the LB job and its nginx gone",
        lambda: (lb_job_id(swarm), nginx_of(swarm)),
        until=lambda left: left == ("", []),
        timeout_s=30,
        poll_s=0.3,
    )
    assert lb_job_id(swarm) == "", "the LB job ended"
    assert nginx_of(swarm) == [], "no nginx process left"
    st = swarm.serving.status(swarm.handle)  # type: ignore[arg-type]
    assert st.url is None and st.phase in (ServingPhase.FAILED, ServingPhase.STOPPED), st


def test_two_swarms_on_the_same_ports_each_route_only_to_their_own(slurm_swarm: MakeSwarm) -> None:
    a_cfg = stub_config(replicas=2)
    b_cfg = stub_config(replicas=2, port=a_cfg.port, backend={"lb_port": a_cfg.backend.lb_port})  # type: ignore[union-attr]
    a, b = slurm_swarm(a_cfg), slurm_swarm(b_cfg)
    a.handle = a.serving.create_or_update(a.cfg)
    b.handle = b.serving.create_or_update(b.cfg)
    a.serving.wait_ready(a.handle, 120)
    b.serving.wait_ready(b.handle, 120)
    ups = {}
    for s in (a, b):
        st = s.serving.status(s.handle)  # type: ignore[arg-type]
        assert st.phase is ServingPhase.RUNNING and st.healthy == 2, st
        ups[s.cfg.name] = set(re.findall(r"^server (\S+)", s.paths.upstreams.read_text(), re.M))
        assert len(ups[s.cfg.name]) == 2
        assert all(r.url and r.health is ReplicaHealth.HEALTHY for r in st.replicas)
    assert not ups[a.cfg.name] & ups[b.cfg.name], ups
    urls = {s.cfg.name: s.serving.status(s.handle).url for s in (a, b)}  # type: ignore[arg-type]
    assert urls[a.cfg.name] != urls[b.cfg.name]
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
    keys = {u: s.paths.api_key_file.read_text().strip() for s in (a, b) for u in ups[s.cfg.name]}  # each its own
    for s in (a, b):  # requests through each LB are served by its own replicas only (request counters)
        counts = {u: requests(u, keys[u]) for u in ups[a.cfg.name] | ups[b.cfg.name]}
        auth = {"Authorization": f"Bearer {s.paths.api_key_file.read_text().strip()}"}
        for _ in range(6):
            url = f"{urls[s.cfg.name]}/v1/chat/completions"
            assert httpx.post(url, json=body, headers=auth, timeout=10).status_code == 200
        grew = {u for u in counts if requests(u, keys[u]) > counts[u]}
        assert grew and grew <= ups[s.cfg.name], (s.cfg.name, grew, ups)


def requests(addr: str, key: str) -> int:
    """The stub's request counter (a closed swarm's stub wants the key on /stats too)."""
    resp = httpx.get(f"http://{addr}/stats", headers={"Authorization": f"Bearer {key}"}, timeout=5)
    return int(resp.raise_for_status().json()["requests"])


@pytest.mark.slurm_whole  # 6 GPUs: more than half the node
def test_a_partial_last_task_asks_slurm_only_for_the_gpus_it_uses(slurm_swarm: MakeSwarm) -> None:
    # 3 replicas x 2 GPUs, 4 GPUs per node: task 0 runs 2 replicas (gpu:4), task 1 runs one (gpu:2)
    swarm = slurm_swarm(stub_config(replicas=3, gpus_per_replica=2, gpus_per_node=4))
    swarm.handle = swarm.serving.create_or_update(swarm.cfg)
    out = subprocess.run(
        ["squeue", "-h", "-r", "-n", swarm.serving.names.replicas, "-o", "%K|%b"], capture_output=True, text=True
    ).stdout
    gres = dict(line.split("|", 1) for line in out.split())
    assert gres["0"].endswith("gpu:4") and gres["1"].endswith("gpu:2"), gres


def test_with_an_api_key_lb_and_replicas_refuse_requests_without_it(slurm_swarm: MakeSwarm, tmp_path: Path) -> None:
    swarm = slurm_swarm(stub_config(replicas=2, api_key="sk-test-key-42"))
    handle = swarm.up()
    st = swarm.serving.status(handle)
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
    # every route the engine (the stub's ROUTES) and nginx (its locations) serve, and one nobody does: GET
    # and POST at the LB and at each replica's port, without the key, with a wrong one, ... all 401
    routes = sorted({*ROUTES, *nginx_locations(swarm.paths.nginx_conf), "/no-such-route"})
    bases = [st.url.removesuffix("/v1"), *(r.url for r in st.replicas)]
    tries = [(m, r) for r in routes for m in ("GET", "POST")]
    assert refused_without_key(bases, tries, "sk-test-key-42") == []
    auth = {"Authorization": "Bearer sk-test-key-42"}
    for route in ("/health", "/metrics", "/nginx-health", "/nginx-status"):  # the key opens them
        assert httpx.get(st.url.removesuffix("/v1") + route, headers=auth, timeout=10).status_code == 200, route
    assert httpx.post(f"{st.url}/v1/chat/completions", json=body, headers=auth, timeout=10).status_code == 200
    spec = make_job(tmp_path, 200, shards=2)
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=2, detach=False))
    assert compute.probe(job).status is JobStatus.SUCCEEDED
    assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(200)]
    no_failed_rows(tmp_path / "job")


def test_cancel_lets_the_steps_flush_and_the_rerun_is_exactly_once(slurm_swarm: MakeSwarm, tmp_path: Path) -> None:
    swarm = slurm_swarm(stub_config(replicas=1, engine={"args": ["--latency-ms", "50"]}))
    handle = swarm.up()
    spec = make_job(tmp_path, 2000, concurrency=4, shards=2, drain_seconds=1)
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=2))
    parts = tmp_path / "job" / "shards"
    wait_until(
        "a part file of each shard",
        lambda: len(list(parts.glob("*/part-*.parquet"))),
        until=lambda n: n >= 2,
        timeout_s=30,
        poll_s=0.3,
    )
    compute.cancel(job)
    probe = compute.probe(job)
    assert probe.status is JobStatus.CANCELLED and probe.exit_code == 75, probe  # flushed, not killed
    progress = [json.loads(p.read_text()) for p in parts.glob("*/progress.json")]
    assert len(progress) == 2 and all(p["state"] != "running" for p in progress), progress
    assert not (tmp_path / "out.parquet").exists()
    again = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=2, detach=False))
    assert compute.probe(again).status is JobStatus.SUCCEEDED
    assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(2000)]


def test_a_replica_task_that_keeps_failing_at_start_is_resubmitted_once_and_status_says_why(
    slurm_swarm: MakeSwarm,
) -> None:
    """A task that leaves the queue before its replica ever became healthy (here: cancelled while its
    engine still starts; on a site: Ray that cannot start) is resubmitted once more, not five times:
    the second time the reconciler leaves it out, and status says why."""
    swarm = slurm_swarm(stub_config(replicas=1, engine={"args": ["--startup-delay-s", "600"]}))
    swarm.handle = swarm.serving.create_or_update(swarm.cfg)

    def record() -> dict:
        return read_json(swarm.paths.slurm_record, {}) or {}

    def starting() -> bool:  # the watchdog of the task's latest submission started its engine
        started = (read_json(swarm.paths.replica_status(0), {}) or {}).get("started_at") or 0
        return float(started) >= float(record()["submitted"]["0"])

    def queued(task: str) -> bool:
        out = subprocess.run(["squeue", "-h", "-o", "%i", "-n", swarm.serving.names.replicas], capture_output=True)
        return task in out.stdout.decode().split()

    first = record()["tasks"]["0"]
    wait_until("replica 0 starting", starting, timeout_s=120)
    SlurmClient().scancel([first])
    wait_until("task 0 resubmitted", record, until=lambda r: r["tasks"]["0"] != first, timeout_s=60)  # once
    second = record()["tasks"]["0"]
    assert record()["start_failures"]["0"] == 1
    wait_until("replica 0 starting again", starting, timeout_s=120)
    SlurmClient().scancel([second])
    wait_until("two start failures recorded", record, until=lambda r: r["start_failures"].get("0") == 2, timeout_s=60)
    wait_until("the second task out of the queue", lambda: not queued(second), timeout_s=60)
    assert record()["tasks"]["0"] == second and record()["resubmits"]["0"] == 1, "not resubmitted again"
    status = swarm.serving.status(swarm.handle)
    assert "replica task 0 is not resubmitted" in status.detail, status
    assert "before any of its replicas became healthy" in status.detail, status
