"""Local compute specifics: reattach by id, vanished processes, graceful cancel, log streaming."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from local_kit import stub_config

from prefect_swarm.backends.local.compute import LocalCompute
from prefect_swarm.exceptions import StateError
from prefect_swarm.interfaces import ComputeBackend, JobHandle, JobRequest, JobStatus, ServingHandle
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.waiting import wait_until


@pytest.fixture
def compute() -> LocalCompute:
    cfg = stub_config()
    handle = ServingHandle(
        name=cfg.name,
        backend="local",
        url="http://127.0.0.1:1",
        meta={"replica_urls": ["http://127.0.0.1:1", "http://127.0.0.1:2"]},
    )
    return LocalCompute(cfg, SwarmPaths.for_swarm(cfg.name), handle)


def test_is_a_compute_backend(compute: LocalCompute) -> None:
    assert isinstance(compute, ComputeBackend)


def test_reattach_by_id_alone(compute: LocalCompute) -> None:
    job = compute.submit(JobRequest(name="by id", command=[sys.executable, "-c", "print('hi')"], nshards=2))
    again = compute.handle_for(job.id)
    assert compute.wait(again, poll_s=0.1) is JobStatus.SUCCEEDED
    assert again.meta["shards"] == job.meta["shards"]
    with pytest.raises(StateError, match="no local job"):
        compute.handle_for("nope-123")


def test_a_killed_wrapper_is_failed_not_running(compute: LocalCompute) -> None:
    job = compute.submit(JobRequest(name="doomed", command=[sys.executable, "-c", "import time; time.sleep(60)"]))
    wrapper = psutil.Process(job.meta["shards"][0]["pid"])
    children = wrapper.children()
    wrapper.kill()
    wrapper.wait(5)
    probe = compute.probe(job)
    assert probe.status is JobStatus.FAILED and probe.exit_code is None
    assert "vanished" in probe.detail
    for child in children:
        child.kill()


def test_cancel_lets_the_job_flush(compute: LocalCompute, tmp_path: Path) -> None:
    flushed = tmp_path / "flushed"
    code = (
        "import signal, sys, time\n"
        f"def bye(*a): open({str(flushed)!r}, 'w').write('ok'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    job = compute.submit(JobRequest(name="flusher", command=[sys.executable, "-c", code]))
    log = compute._paths(job).log(0)
    wait_until("'ready' in the job's log", log.read_text, until=lambda text: "ready" in text, timeout_s=10, poll_s=0.05)
    compute.cancel(job)
    assert compute.probe(job).status is JobStatus.CANCELLED
    assert flushed.read_text() == "ok"  # got one SIGTERM, had time to flush


def test_wait_streams_logs(compute: LocalCompute, capsys: pytest.CaptureFixture[str]) -> None:
    job = compute.submit(
        JobRequest(name="talk", command=[sys.executable, "-c", "print('line one'); print('line two')"])
    )
    assert compute.wait(job, stream_logs=True, poll_s=0.1) is JobStatus.SUCCEEDED
    out = capsys.readouterr().out
    assert "line one" in out and "line two" in out and "shard 0" in out


def test_probe_of_an_unreadable_job_is_could_not_tell(compute: LocalCompute) -> None:
    probe = compute.probe(JobHandle(id="ghost-1", backend="local"))
    assert probe.status is None and probe.error


def test_exit_by_signal(compute: LocalCompute) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    job = compute.submit(JobRequest(name="sig", command=[sys.executable, "-c", code]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.FAILED
    assert compute.probe(job).exit_code == -signal.SIGKILL


def test_bad_shard_arguments(compute: LocalCompute) -> None:
    with pytest.raises(ValueError):
        compute.submit(JobRequest(name="x", command=["true"], nshards=2, shard_id=2))
    with pytest.raises(ValueError):
        compute.submit(JobRequest(name="x", command=[]))


def test_shards_on_one_core_start_one_after_another(compute: LocalCompute) -> None:
    """With one core for the submit, shard i starts once shard i - 1 has written its first line (its
    modules loaded): a shard that takes 0.5 s to get there delays the next by as much."""
    code = "import time; time.sleep(0.5); print('up', time.time(), flush=True)"
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    try:
        job = compute.submit(JobRequest(name="stagger", command=[sys.executable, "-c", code], nshards=3))
    finally:
        os.sched_setaffinity(0, mask)
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    up = [float(compute._paths(job).log(i).read_text().split()[1]) for i in range(3)]
    assert up[1] - up[0] >= 0.45 and up[2] - up[1] >= 0.45, up


def test_a_signal_before_the_start_ends_the_wrapper_without_starting(tmp_path: Path) -> None:
    """The wrapper waiting for an earlier shard's log is signalled (a cancel): it exits 75 (run it again)
    and records it; the command never ran."""
    marker, before, out = tmp_path / "ran", tmp_path / "earlier.log", tmp_path / "exit.json"
    before.touch()
    argv = [sys.executable, "-m", "prefect_swarm.sidecar.exitcode", "--out", str(out), "--after", str(before)]
    argv += ["--after-s", "60", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    wrapper = subprocess.Popen(argv)
    try:

        def catches_term() -> bool:  # its handler is in place: the wait has begun
            status = Path(f"/proc/{wrapper.pid}/status").read_text()
            caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
            return bool(caught & (1 << (signal.SIGTERM - 1)))

        wait_until("the wrapper's TERM handler in place", catches_term, timeout_s=30)
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(30) == 75
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
    assert json.loads(out.read_text())["exit_code"] == 75
    assert not marker.exists()
