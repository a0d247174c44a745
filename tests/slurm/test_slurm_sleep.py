"""Sleep and wake on the real single-node Slurm with GPU-like simulator replicas (sleep mode): a
sleeping replica leaves nginx's upstreams and the job steps' replica list and keeps its array task;
a job across a sleep and a wake loses no row; the woken replica is routed to again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
from _slurmkit import LiveSwarm, job_command, make_job, output_ids, stub_config

from prefect_swarm.backends.slurm.compute import SlurmCompute
from prefect_swarm.backends.slurm.lb import read_heads, resolve
from prefect_swarm.interfaces import JobRequest, JobStatus
from prefect_swarm.paths import JobPaths
from prefect_swarm.testing.gpu_sim import MODULE
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

SLEEPY = {"command": engine_command(module=MODULE, enable_sleep_mode=True, step_ms=5, wake_s=0.3), "sleep_mode": True}


def test_a_sleeping_replica_leaves_the_lb_keeps_its_task_and_a_job_across_it_loses_nothing(
    slurm_swarm: Callable[..., LiveSwarm], tmp_path: Path
) -> None:
    swarm = slurm_swarm(stub_config(replicas=2, engine=SLEEPY))
    handle = swarm.up()
    tasks = [r.external_id for r in swarm.serving.status(handle).replicas]
    paths = swarm.serving.paths
    addr = resolve(read_heads(paths)[1])
    assert addr is not None and f"server {addr} " in paths.upstreams.read_text()
    spec = make_job(tmp_path, 3000, concurrency=4, shards=2)
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=2))
    wait_until("the job running", lambda: compute.probe(job).status, until=lambda s: s is JobStatus.RUNNING,
               timeout_s=60)  # fmt: skip

    (slept,) = swarm.serving.sleep(handle, [1])
    assert slept.asleep and slept.url == f"http://{addr}"
    assert f"server {addr} " not in paths.upstreams.read_text()  # out of nginx
    assert 1 not in read_heads(paths) and f"http://{addr}" not in compute.endpoints()  # and the job steps' list
    headers = {"Authorization": f"Bearer {swarm.serving.client_key()}"}
    assert httpx.get(f"http://{addr}/is_sleeping", headers=headers).json() == {"is_sleeping": True}
    status = swarm.serving.status(handle).replicas
    assert [r.external_id for r in status] == tasks  # the allocation is kept
    assert "asleep (level 1)" in status[1].detail, status[1]

    (woke,) = swarm.serving.wake(handle, [1])
    assert not woke.asleep and woke.seconds >= 0.3
    assert f"server {addr} " in paths.upstreams.read_text()  # routed to again
    assert compute.wait(job, poll_s=0.5) is JobStatus.SUCCEEDED, compute.probe(job)
    assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(3000)]  # exactly once
    failed = JobPaths(tmp_path / "job").failed_rows
    assert not failed.exists() or not failed.read_text().strip(), failed.read_text()  # 0 failed rows
    swarm.serving.sleep(handle, [0])
    swarm.down()
    assert not paths.replica_asleep(0).exists()  # nothing of the swarm outlives down
