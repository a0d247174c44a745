"""A process reference survives a step of the wall clock and never names another process.

psutil's create time is the start since boot plus the boot time the kernel reports now; a step of
the wall clock (NTP, a VM resumed from a snapshot) moves that boot time by whole seconds. The step
is made here the way the kernel shows it: the boot time psutil reads moves, for the create times of
every process alike.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import psutil
import pytest
from local_kit import stub_config

from prefect_swarm.backends.local.compute import LocalCompute
from prefect_swarm.interfaces import JobRequest, JobStatus, ServingHandle, ServingPhase
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.sidecar.procref import ProcRef
from prefect_swarm.sidecar.watchdog import live_since
from prefect_swarm.swarm import Swarm


def step_the_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """From now on this process reads a boot time ``seconds`` later, as after a step of the wall clock."""
    real = psutil._psplatform.boot_time  # what psutil.boot_time() and Process.create_time() read
    monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real() + seconds)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("seconds", [1.0, -1.0, 3600.0])
def test_a_reference_outlives_a_step_of_the_clock(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, seconds: float
) -> None:
    ref = ProcRef.from_dict(ProcRef.of(child.pid).to_dict())  # as a record on disk carries it
    assert ref is not None and ref.alive()
    step_the_clock(monkeypatch, seconds)
    assert psutil.Process(child.pid).create_time() != ref.create_time  # the wall-clock start moved
    assert ref.alive() and live_since(ref.to_dict()) == ref.create_time
    child.kill()
    child.wait()
    assert not ref.alive() and live_since(ref.to_dict()) is None


def test_another_start_on_the_same_pid_is_not_the_process(child: subprocess.Popen[bytes]) -> None:
    ref = ProcRef.of(child.pid)
    assert ref.create_time is not None and ref.boot_time is not None
    for off in (1.0, -1.0, 0.5):  # what a process that got the pid later (or earlier) would read
        assert not ProcRef(child.pid, ref.create_time + off, ref.boot_time).alive()


def test_a_record_without_a_boot_time_is_compared_on_the_wall_clock(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    old = ProcRef.from_dict({"pid": child.pid, "create_time": ProcRef.of(child.pid).create_time})
    assert old is not None and old.boot_time is None and old.alive()
    step_the_clock(monkeypatch, 1.0)
    assert not old.alive()  # it cannot tell a step from another process: it says gone, never a stranger


def test_a_running_shard_is_running_after_a_step_of_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job a `job status` or `job wait` probes after the step is RUNNING, not "vanished"; cancel
    still reaches it."""
    cfg = stub_config()
    handle = ServingHandle(name=cfg.name, backend="local", url="http://127.0.0.1:1", meta={})
    compute = LocalCompute(cfg, SwarmPaths.for_swarm(cfg.name), handle)
    job = compute.submit(JobRequest(name="long", command=[sys.executable, "-c", "import time; time.sleep(60)"]))
    step_the_clock(monkeypatch, 1.0)
    again = compute.handle_for(job.id)
    assert compute.probe(again).status is JobStatus.RUNNING
    compute.cancel(again)
    assert compute.probe(again).status is JobStatus.CANCELLED


def test_a_swarm_is_found_running_and_stopped_whole_after_a_step_of_the_clock(
    local_swarm: Callable[..., Swarm], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdogs' pid records (written here) and the replicas' (written by each watchdog process
    into its status file) both survive the step: `status` finds the swarm up, and `down` stops all of
    it, also the replicas whose watchdogs were killed -9 (found by their own records alone)."""
    swarm = local_swarm(replicas=2)
    assert swarm.handle is not None
    dogs = [psutil.Process(w["pid"]) for w in swarm.handle.meta["watchdogs"]]
    family = [*dogs, *(c for d in dogs for c in d.children(recursive=True))]
    step_the_clock(monkeypatch, 1.0)
    again = Swarm.from_state(swarm.cfg.name)
    assert again.status().phase is ServingPhase.RUNNING
    for dog in dogs:
        dog.kill()  # its replica runs on, orphaned
    psutil.wait_procs(dogs, timeout=10)
    again.down()
    assert [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert again.status().phase is ServingPhase.STOPPED
