"""Where the platform differs from what a backend would assume (issue: "Lepton, third pass"): the
server assigns job ids and takes duplicate names, deletes finish in the background, an old server
answers a create with an empty body, a fresh deployment reads UNK, and a crash loop on the new
Endpoint API shows only in its events. Each test fails against the fake that assumed otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.backends.lepton.serving import LeptonServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ReadinessError
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.fake_lepton import FakeLepton
from prefect_swarm.testing.waiting import wait_until

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]


def _api(fake: FakeLepton):  # type: ignore[no-untyped-def]
    from leptonai.api.v2 import APIClient

    return APIClient(workspace_id=fake.workspace_id, auth_token=fake.token, url=fake.url)


def _job(name: str):  # type: ignore[no-untyped-def]
    from leptonai.api.v2.types.common import Metadata
    from leptonai.api.v2.types.deployment import LeptonContainer
    from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

    return LeptonJob(
        metadata=Metadata(id=name, name=name),
        spec=LeptonJobUserSpec(
            resource_shape="cpu.small", container=LeptonContainer(image="x", command=[sys.executable, "-c", "pass"])
        ),
    )


def serving(cfg: SwarmConfig) -> LeptonServing:
    return LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))


# ---------------------------------------------------------------------------------- jobs
def test_the_fake_assigns_job_ids_and_takes_a_name_twice(fake_lepton: FakeLepton) -> None:
    api = _api(fake_lepton)
    first, second = api.job.create(_job("twin")), api.job.create(_job("twin"))  # no 409
    assert first.metadata.name == second.metadata.name == "twin"
    assert len({first.metadata.id_, second.metadata.id_, "twin"}) == 3
    assert api.job.get(first.metadata.id_).metadata.name == "twin"
    with pytest.raises(Exception, match="404"):
        api.job.get("twin")  # the name is no id
    for job in (first, second):
        api.job.delete(job.metadata.id_)


def test_the_storage_check_polls_and_deletes_by_the_returned_id(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None).check_shared_storage(timeout_s=60)
    (post,) = [p for m, p, s in fake_lepton.requests if m == "POST" and p.endswith("/jobs")]
    by_id = [(m, p, s) for m, p, s in fake_lepton.requests if "/jobs/" in p]
    assert by_id and all(s == 200 for _m, _p, s in by_id)  # every poll and the delete found the job
    (job_id,) = {p.split("/jobs/")[1].split("/")[0] for _m, p, _s in by_id}
    assert job_id.startswith("lep-storage-") and job_id.count("-") == 4  # <name>-<server's suffix>
    assert ("DELETE", f"{post}/{job_id}", 200) in fake_lepton.requests
    fake_lepton.wait_deletes()  # deletes finish in the background, as on the platform
    assert fake_lepton.jobs == {}


# ---------------------------------------------------------------------------------- deletes
@pytest.mark.parametrize("fake_lepton", [{"delete_s": 1.0}], indirect=True)
def test_the_fake_deletes_in_the_background(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(storage_check_timeout_s=None)
    srv = serving(cfg)
    srv.create_or_update(cfg)
    api = _api(fake_lepton)
    api.deployment.delete("lep")
    assert str(api.deployment.get("lep").status.state.value) == "Deleting"
    spec = srv._spec(cfg)
    with pytest.raises(Exception, match="409"):
        api.deployment.create(spec)  # the old deployment still holds the name
    time.sleep(0.6)  # the point: the fake's delete phases pass with time, as Lepton's do
    with pytest.raises(Exception, match="404"):
        api.deployment.get("lep")  # gone from reads, but ...
    with pytest.raises(Exception, match="409"):
        api.deployment.create(spec)  # ... its name is not free yet
    time.sleep(0.6)
    api.deployment.create(spec)
    api.deployment.delete("lep")


@pytest.mark.parametrize(
    "fake_lepton",
    [{"delete_s": 2.0}, {"delete_s": 2.0, "new_deployment_api": True}],
    indirect=True,
    ids=["legacy", "new-api"],
)
def test_down_then_up_of_the_same_name_at_once(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(storage_check_timeout_s=None)
    srv = serving(cfg)
    handle = srv.create_or_update(cfg)
    srv.delete(handle)
    again = srv.create_or_update(cfg)  # the delete has not finished: 409, retried until the name is free
    posts = [s for m, p, s in fake_lepton.requests if m == "POST" and p.endswith(("/deployments", "/endpoints"))]
    assert posts[0] == 200 and posts[-1] == 200 and 409 in posts
    assert srv.wait_ready(again, timeout_s=30).phase is ServingPhase.RUNNING
    srv.delete(again)
    fake_lepton.wait_deletes()  # its background delete, so the fixture finds nothing running


# ---------------------------------------------------------------------------------- create and readiness
@pytest.mark.parametrize(
    "fake_lepton",
    [{"legacy_create_response": True}, {"legacy_create_response": True, "new_deployment_api": True}],
    indirect=True,
    ids=["legacy", "new-api"],
)
def test_an_empty_create_answer_reads_the_deployment_back(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(storage_check_timeout_s=None)
    srv = serving(cfg)
    handle = srv.create_or_update(cfg)
    assert handle.url and handle.url.startswith("http://127.0.0.1:")
    assert srv.wait_ready(handle, timeout_s=30).phase is ServingPhase.RUNNING
    srv.delete(handle)


@pytest.mark.parametrize("fake_lepton", [{"unknown_reads": 3}], indirect=True)
def test_a_transient_unknown_state_is_waited_out(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(storage_check_timeout_s=None)
    srv = serving(cfg)
    handle = srv.create_or_update(cfg)
    assert srv.status(handle).phase is ServingPhase.UNKNOWN  # the platform's "" state
    assert srv.wait_ready(handle, timeout_s=30).phase is ServingPhase.RUNNING
    srv.delete(handle)


@pytest.mark.parametrize("fake_lepton", [{"restart_crashed": True, "new_deployment_api": True}], indirect=True)
def test_a_crash_loop_on_the_new_endpoint_api_fails_readiness_early(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    fake_lepton.fail_deployments = ("broken",)
    cfg = lepton_cfg(name="broken", storage_check_timeout_s=None)
    srv = serving(cfg)
    handle = srv.create_or_update(cfg)
    t0 = time.monotonic()
    with pytest.raises(ReadinessError, match=r"is crash-looping: the platform restarted a replica \d+ times"):
        srv.wait_ready(handle, timeout_s=600)
    assert time.monotonic() - t0 < 15
    assert not any(p.endswith("/termination") for _m, p, _s in fake_lepton.requests)  # no such route there
    srv.delete(handle)


# ---------------------------------------------------------------------------------- logs
def test_a_live_replica_log_streams_until_the_read_timeout(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    import requests

    from prefect_swarm.interfaces import JobRequest

    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    code = "import time; print('first line', flush=True); time.sleep(60)"
    job = compute.submit(JobRequest(name="live", command=[compute.job_runtime().python, "-c", code]))
    api = _api(fake_lepton)
    (rep,) = api.job.get_replicas(job.id)
    wait_until(
        "the job's first line in its log",
        lambda: fake_lepton.jobs[job.id].log_path.read_text(),
        until=lambda text: "first line" in text,
        timeout_s=20,
        poll_s=0.1,
    )
    got: list[str] = []
    with pytest.raises(requests.ConnectionError):  # the SDK: streamed until the read timeout
        got.extend(api.job.get_log(job.id, rep, timeout=1))
    assert "first line" in "".join(got)
    t0 = time.monotonic()
    assert compute.logs(job, timeout_s=1) == f"[{job.id}] first line"  # kept, not retried away
    assert time.monotonic() - t0 < 8
    compute.cancel(job)


def test_logs_cli_prints_and_follows_a_lepton_replica(
    lepton_cfg: Make, fake_lepton: FakeLepton, follow_cli: Callable[..., Any]
) -> None:
    from prefect_swarm.swarm import Swarm

    cfg = lepton_cfg(storage_check_timeout_s=None)
    with Swarm(cfg) as swarm:
        log = fake_lepton.deployments["lep"].log_path
        with log.open("a") as fh:
            fh.write("replica said: before\n")
        serving, handle = swarm.backends.serving, swarm.handle
        assert handle is not None
        assert "replica said: before" in "".join(serving.replica_log(handle, 0))  # read until quiet
        with pytest.raises(ReadinessError, match="replica 1 has no log"):
            list(serving.replica_log(handle, 1))
        # the CLI: the state's config holds no token, so it comes from the environment
        followed = follow_cli("logs", "lep", "--follow", env={"LEPTON_WORKSPACE_TOKEN": fake_lepton.token})
        followed.wait_for("replica said: before")  # the stream stays open while the replica runs ...
        with log.open("a") as fh:
            fh.write("replica said: after\n")
        followed.wait_for("replica said: after")  # ... and carries what it gains
        assert followed.stop() == 0


def test_a_followed_replica_log_reconnects_when_the_stream_drops(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    import threading

    from prefect_swarm.swarm import Swarm

    cfg = lepton_cfg(storage_check_timeout_s=None)
    swarm = Swarm(cfg)
    swarm.up()
    swarm.wait_ready()
    log = fake_lepton.deployments["lep"].log_path
    serving, handle = swarm.backends.serving, swarm.handle
    assert handle is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(serving.replica_log(handle, 0, follow=True)), daemon=True)

    def printed(text: str) -> None:  # waits on what the follower printed
        wait_until(f"{text!r} followed", lambda: "".join(got), until=lambda out: text in out, timeout_s=20, poll_s=0.05)

    with log.open("a") as fh:
        fh.write("replica said: before\n")
    reader.start()
    printed("replica said: before")
    for n in range(3):  # the platform cuts long streams: each time the follower opens it again
        fake_lepton.drop_log_streams()
        with log.open("a") as fh:
            fh.write(f"replica said: after drop {n}\n")
        printed(f"replica said: after drop {n}")
    text = "".join(got)
    assert text.count("replica said: before") == 1 and text.count("after drop 0") == 1  # nothing printed twice
    swarm.down()  # the replica goes: the follower ends
    reader.join(timeout=30)
    assert not reader.is_alive()
