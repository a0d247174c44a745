"""The Lepton backend through the real leptonai SDK against the loopback fake workspace."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.backends.lepton.serving import LeptonServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import BackendError, ConfigError, ReadinessError
from prefect_swarm.interfaces import JobRequest, JobStatus, ServingPhase
from prefect_swarm.interfaces.types import ReplicaHealth
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import FakeLepton
from prefect_swarm.testing.stub_engine import engine_command

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]


def serving(cfg: SwarmConfig) -> LeptonServing:
    return LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))


def test_up_ready_chat_down(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    srv = serving(cfg)
    handle = srv.create_or_update(cfg)
    assert handle.backend == "lepton" and handle.url
    status = srv.wait_ready(handle, timeout_s=30)
    assert status.phase is ServingPhase.RUNNING and "chat completion answered" in status.detail
    resp = httpx.post(
        handle.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {cfg.api_key.get_secret_value()}"},
    )
    assert resp.status_code == 200
    # the endpoint refuses other tokens, like Lepton's gateway
    assert httpx.post(handle.url + "/v1/chat/completions", json={}, timeout=10).status_code == 401
    srv.delete(handle)
    assert srv.status(handle).phase is ServingPhase.STOPPED
    srv.delete(handle)  # idempotent
    assert fake_lepton.running_processes() == []


def test_create_or_update_reconciles(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    srv = serving(cfg)
    first = srv.create_or_update(cfg)
    again = srv.create_or_update(cfg)
    assert again.name == first.name and len(fake_lepton.deployments) == 1
    posts = [r for r in fake_lepton.requests if r[0] == "POST" and r[1].endswith("/deployments")]
    assert len(posts) == 1
    changed = cfg.model_copy(update={"replicas": 2, "env": {"EXTRA": "1"}})
    srv.create_or_update(changed)
    spec = fake_lepton.deployments["lep"].body["spec"]
    assert spec["resource_requirement"]["min_replicas"] == 2
    assert {"name": "EXTRA", "value": "1"} in spec["envs"]
    assert fake_lepton.deployments["lep"].body["metadata"]["version"] == 2
    st = srv.wait_ready(again, timeout_s=30)
    assert len(st.replicas) == 2
    srv.delete(first)


def test_deployment_spec_carries_config(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    fake_lepton.node_groups, fake_lepton.image_pull_secrets = {"ng-1": "h100-pool"}, ("regcred",)
    cfg = lepton_cfg(node_groups=["ng-1"], image_pull_secrets=["regcred"], resource_shape="gpu.2xh100-sxm")
    srv = serving(cfg)
    h = srv.create_or_update(cfg)
    spec = fake_lepton.deployments["lep"].body["spec"]
    assert spec["resource_requirement"]["resource_shape"] == "gpu.2xh100-sxm"
    assert spec["resource_requirement"]["affinity"]["allowed_dedicated_node_groups"] == ["ng-1"]
    assert spec["image_pull_secrets"] == ["regcred"]
    assert spec["mounts"][0]["from"] == "node-nfs:lepton-shared-fs"
    assert spec["container"]["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    srv.delete(h)


def test_failed_deployment_raises_with_evidence(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    fake_lepton.fail_deployments = ("broken",)
    cfg = lepton_cfg(name="broken")
    srv = serving(cfg)
    h = srv.create_or_update(cfg)
    t0 = time.monotonic()
    with pytest.raises(ReadinessError, match="broken") as err:
        srv.wait_ready(h, timeout_s=60)
    assert time.monotonic() - t0 < 10  # fails on Error at once, not at the timeout
    assert "workspace 'ws-test'" in str(err.value)
    assert srv.status(h).phase is ServingPhase.FAILED
    srv.delete(h)


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_forced_states_map_to_phases(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    srv = serving(cfg)
    h = srv.create_or_update(cfg)
    for state, phase in [
        ("Updating", ServingPhase.INITIALIZING),
        ("Not Ready", ServingPhase.INITIALIZING),
        ("Stopped", ServingPhase.STOPPED),
        ("Error", ServingPhase.FAILED),
        ("Ready", ServingPhase.RUNNING),
    ]:
        fake_lepton.force_state("lep", state)
        st = srv.status(h)
        assert st.phase is phase, state
        if state == "Not Ready":
            assert all(r.health is ReplicaHealth.UNHEALTHY for r in st.replicas)
    srv.delete(h)


def test_two_shard_job_fans_out(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    srv = serving(cfg)
    h = srv.create_or_update(cfg)
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), h)
    code = "import os; e = os.environ; print('shard', e['PREFECT_SWARM_SHARD_ID'], e['ENDPOINT'], e['MODEL'])"
    job = compute.submit(
        JobRequest(name="echo", command=[compute.job_runtime().python, "-c", code], nshards=2, env={"X": "1"})
    )
    assert len(job.meta["jobs"]) == 2
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    logs = compute.logs(job)
    assert f"shard 0 {h.url} stub-model" in logs and f"shard 1 {h.url} stub-model" in logs
    env = fake_lepton.job_env(job.meta["jobs"][1])
    assert env["X"] == "1" and env["PREFECT_SWARM_NSHARDS"] == "2"
    assert env["PREFECT_SWARM_ENDPOINTS"] == h.url
    assert env["PREFECT_SWARM_API_KEY"] == cfg.api_key.get_secret_value()  # resolved from a Lepton secret
    spec = fake_lepton.jobs[job.meta["jobs"][0]].body["spec"]
    assert cfg.api_key.get_secret_value() not in str(spec)
    assert spec["container"]["command"][-4:] == ["--shard-id", "0", "--nshards", "2"]
    srv.delete(h)
    fake_lepton.wait_deletes()  # the jobs' deletes finish in the background, as on the platform
    assert fake_lepton.jobs == {} and fake_lepton.secrets == {}


def test_failing_job_reports_failed_and_running_job_running(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    fake_lepton.fail_jobs = ("broken",)  # matched in job ids, which end in hex: "bad" may turn up there
    bad = compute.submit(JobRequest(name="broken", command=[compute.job_runtime().python, "-c", "print(1)"]))
    assert compute.wait(bad, poll_s=0.1) is JobStatus.FAILED
    assert "injected job failure" in compute.logs(bad)
    slow = compute.submit(
        JobRequest(name="slow", command=[compute.job_runtime().python, "-c", "import time; time.sleep(60)"])
    )
    seen = {compute.probe(slow).status for _ in range(3)}
    assert JobStatus.RUNNING in seen and not any(s and s.finished for s in seen)
    compute.cancel(slow)
    assert compute.wait(slow, poll_s=0.1) is JobStatus.CANCELLED
    compute.cancel(slow)  # idempotent
    compute.cancel(bad)  # cancelling a finished job is not an error
    assert compute.probe(bad).status is JobStatus.FAILED
    assert fake_lepton.running_processes() == []


def test_detach_false_waits(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    h = compute.submit(
        JobRequest(name="w", command=[compute.job_runtime().python, "-c", "import time; time.sleep(0.5)"], detach=False)
    )
    assert compute.probe(h).status is JobStatus.SUCCEEDED


def test_wrong_token_names_the_workspace(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(token="not-the-token")
    with pytest.raises(ConfigError) as err:
        serving(cfg).create_or_update(cfg)
    text = str(err.value)
    assert "ws-test" in text and "token" in text and "HTTP 401" in text
    assert "not-the-token" not in text and "no****en" not in text  # not even the SDK's partial token
    assert fake_lepton.deployments == {}


def test_wrong_workspace_names_it(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    url = fake_lepton.url.replace("ws-test", "ws-other")
    cfg = lepton_cfg(workspace_id="ws-other", workspace_url=url)
    with pytest.raises(ConfigError, match="ws-other"):
        serving(cfg).create_or_update(cfg)


def test_token_from_environment(lepton_cfg: Make, fake_lepton: FakeLepton, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_LEPTON_TOKEN", fake_lepton.token)
    cfg = lepton_cfg(token=None, token_env="MY_LEPTON_TOKEN")
    srv = serving(cfg)
    srv.delete(srv.create_or_update(cfg))
    monkeypatch.delenv("MY_LEPTON_TOKEN")
    Swarm(cfg).validate()  # the pre-flight `prefect-swarm validate` runs needs no token
    with pytest.raises(ConfigError, match="MY_LEPTON_TOKEN"):
        serving(cfg).create_or_update(cfg)


def test_transient_503_and_429_are_retried(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    srv = serving(cfg)
    fake_lepton.inject(503, count=2, match="/deployments")
    fake_lepton.inject(429, count=1, match="/deployments")
    h = srv.create_or_update(cfg)
    codes = [r[2] for r in fake_lepton.requests if "/deployments" in r[1]]
    assert codes[:3] == [503, 503, 429] and 200 in codes
    srv.delete(h)


def test_api_unavailable_gives_up_with_backend_error(
    lepton_cfg: Make, fake_lepton: FakeLepton, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_swarm.backends.lepton.client import LeptonClient

    monkeypatch.setenv("PREFECT_SWARM_LEPTON_API_BACKOFF_S", "0.01")
    cfg = lepton_cfg()
    fake_lepton.inject(503, count=100, match="/jobs")
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    with pytest.raises(BackendError, match="HTTP 503"):
        compute.submit(JobRequest(name="x", command=[compute.job_runtime().python, "-c", "pass"]))
    assert sum(1 for r in fake_lepton.requests if r[1].endswith("/jobs")) == LeptonClient.attempts


def test_other_4xx_carries_the_api_message(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    fake_lepton.inject(400, count=1, match="/jobs")
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    with pytest.raises(BackendError, match=r"HTTP 400.*injected HTTP 400"):
        compute.submit(JobRequest(name="x", command=[compute.job_runtime().python, "-c", "pass"]))


def test_config_without_shared_mount_is_refused_before_any_call(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    for bad in ({"mounts": []}, {"shared_path": None}, {"shared_path": "/elsewhere/runs"}):
        cfg = lepton_cfg(**bad)
        with pytest.raises(ConfigError, match="shared_path"):
            Swarm(cfg).validate()
    assert fake_lepton.requests == []


def test_no_token_makes_a_public_endpoint(
    lepton_cfg: Make, fake_lepton: FakeLepton, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = lepton_cfg(api_key=None)
    srv = serving(cfg)
    h = srv.create_or_update(cfg)
    assert "without a token" in caplog.text
    spec = fake_lepton.deployments["lep"].body["spec"]
    assert spec["allow_unauthenticated_access"] is True and spec["api_tokens"] == []
    assert "chat completion answered" in srv.wait_ready(h, timeout_s=30).detail
    srv.delete(h)


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new"])
@pytest.mark.parametrize("token", ["api_key", "endpoint_token_secret"])
def test_a_token_makes_a_private_endpoint(lepton_cfg: Make, fake_lepton: FakeLepton, token: str) -> None:
    fake_lepton.secrets["endpoint-token"] = "from-a-secret-1234"
    cfg = lepton_cfg() if token == "api_key" else lepton_cfg(api_key=None, endpoint_token_secret="endpoint-token")
    srv = serving(cfg)
    h = srv.create_or_update(cfg)
    srv.create_or_update(cfg.model_copy(update={"replicas": 2}))  # an update keeps it private
    spec = fake_lepton.deployments["lep"].body["spec"]
    assert spec["allow_unauthenticated_access"] is False and len(spec["api_tokens"]) == 1
    srv.delete(h)


def test_runs_the_container_command_as_given(lepton_cfg: Make, need_lepton_sdk: None) -> None:
    """With run_endpoint_commands the fake runs the engine command itself (the stub as a command engine)."""
    with FakeLepton(run_endpoint_commands=True) as fake:
        base = lepton_cfg()
        cfg = SwarmConfig.model_validate(
            {
                **base.model_dump(by_alias=True, exclude={"api_key"}),
                "api_key": base.api_key.get_secret_value(),
                "backend": {
                    **base.backend.model_dump(by_alias=True, exclude={"token"}),
                    "workspace_url": fake.url,
                    "token": fake.token,
                },
                "engine": {
                    "kind": "command",
                    "python": sys.executable,
                    "command": engine_command(),
                },
            }
        )
        srv = serving(cfg)
        h = srv.create_or_update(cfg)
        assert srv.wait_ready(h, timeout_s=30).phase is ServingPhase.RUNNING
        assert httpx.post(h.url + "/v1/chat/completions", json={}, timeout=10).status_code == 401
        srv.delete(h)
        assert fake.running_processes() == []


def test_endpoint_token_from_lepton_secret(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    fake_lepton.secrets["ENDPOINT_TOKEN"] = "secret-held-by-lepton"
    cfg = lepton_cfg(api_key=None, endpoint_token_secret="ENDPOINT_TOKEN")
    srv = serving(cfg)
    h = srv.create_or_update(cfg)
    st = srv.wait_ready(h, timeout_s=30)
    assert "skipped" in st.detail  # the control plane never holds the value: state + readiness only
    spec = fake_lepton.deployments["lep"].body["spec"]
    assert spec["api_tokens"] == [{"value_from": {"token_name_ref": "ENDPOINT_TOKEN"}}]
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), h)
    job = compute.submit(JobRequest(name="k", command=[compute.job_runtime().python, "-c", "pass"]))
    compute.wait(job, poll_s=0.1)
    assert fake_lepton.job_env(job.id)["PREFECT_SWARM_API_KEY"] == "secret-held-by-lepton"
    envs = fake_lepton.jobs[job.id].body["spec"]["envs"]
    assert {"name": "PREFECT_SWARM_API_KEY", "value_from": {"secret_name_ref": "ENDPOINT_TOKEN"}} in envs
    srv.delete(h)
    assert "ENDPOINT_TOKEN" in fake_lepton.secrets  # the user's secret is not ours to delete


def test_missing_sdk_gives_install_hint(lepton_cfg: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = lepton_cfg()
    for mod in [m for m in sys.modules if m == "leptonai" or m.startswith("leptonai.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "leptonai", None)
    with pytest.raises(ConfigError, match=r"pip install '\.\[lepton\]' .*as the README installs it"):
        Swarm(cfg).validate()


def test_swarm_context_manager_on_lepton(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    with Swarm(cfg) as swarm:
        assert swarm.status().phase is ServingPhase.RUNNING
        assert swarm.endpoints == [swarm.endpoint]
        job = swarm.compute.submit(
            JobRequest(name="ctx", command=[swarm.compute.job_runtime().python, "-c", "import time; time.sleep(30)"])
        )
        assert swarm.compute.probe(job).status in (JobStatus.PENDING, JobStatus.RUNNING)
    # down removed the deployment and the swarm's jobs: nothing left running
    fake_lepton.wait_deletes()
    assert fake_lepton.deployments == {} and fake_lepton.jobs == {}
    assert fake_lepton.running_processes() == []
    again = Swarm.from_state("lep")
    assert again.store.get_swarm("lep").phase == "STOPPED"


def test_a_create_retried_after_a_504_adopts_the_job_it_made(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    fake_lepton.inject(504, count=1, match="/jobs", apply=True)  # created, but the gateway timed out
    job = compute.submit(JobRequest(name="echo", command=[compute.job_runtime().python, "-c", "print(1)"], nshards=2))
    posts = [s for m, p, s in fake_lepton.requests if m == "POST" and p.endswith("/jobs")]
    # the platform would take a second POST of the name as a second job: the retry found the first
    # by its create label and adopted it; then the second shard
    assert posts == [504, 200]
    assert sorted(job.meta["jobs"]) == sorted(fake_lepton.jobs) and len(fake_lepton.jobs) == 2
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED


def test_a_job_of_the_same_name_made_by_another_swarm_is_not_adopted(
    lepton_cfg: Make, fake_lepton: FakeLepton
) -> None:
    from prefect_swarm.backends.lepton import compute as compute_mod

    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    other = LeptonCompute(lepton_cfg(name="other"), SwarmPaths.for_swarm("other"), None)
    request = JobRequest(name="echo", command=[compute.job_runtime().python, "-c", "print(1)"])
    _group, (name,) = compute_mod.job_names("echo", 1, suffix="abc123")
    theirs = other._create_job(name, other.job_spec(request, name, 0, {}))
    fake_lepton.inject(504, count=1, match="/jobs", apply=True)
    mine = compute._create_job(name, compute.job_spec(request, name, 0, {}))
    assert mine != theirs and {mine, theirs} == set(fake_lepton.jobs)  # two jobs share the name
    assert fake_lepton.jobs[mine].body["metadata"]["labels"]["prefect-swarm-swarm"] == "lep"


@pytest.mark.parametrize("name", ["LEPTON_WORKSPACE_ID", "HAS SPACE", "1LEADING_DIGIT"])
def test_env_names_the_platform_refuses_are_refused_before_any_call(
    lepton_cfg: Make, fake_lepton: FakeLepton, name: str
) -> None:
    cfg = lepton_cfg().model_copy(update={"env": {name: "x"}})
    with pytest.raises(ConfigError, match=f"env / engine.env: '{name}' cannot be used on Lepton"):
        serving(cfg).create_or_update(cfg)
    assert fake_lepton.requests == []


def test_the_fake_refuses_a_reserved_env_name(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    import leptonai.api.v2 as v2
    from leptonai.api.v2.types.common import Metadata
    from leptonai.api.v2.types.deployment import EnvVar, LeptonContainer, LeptonDeployment, LeptonDeploymentUserSpec

    api = v2.APIClient(workspace_id=fake_lepton.workspace_id, auth_token=fake_lepton.token, url=fake_lepton.url)
    spec = LeptonDeployment(
        metadata=Metadata(id="d", name="d"),
        spec=LeptonDeploymentUserSpec(
            container=LeptonContainer(image="img", command=["true"]),
            envs=[EnvVar(name="LEPTON_WORKSPACE_ID", value="x")],
        ),
    )
    with pytest.raises(Exception, match="400"):
        api.deployment.create(spec)
    assert fake_lepton.deployments == {}


@pytest.mark.parametrize("field", ["resource_shape", "job_resource_shape"])
def test_a_shape_the_workspace_lacks_is_refused_before_anything_starts(
    lepton_cfg: Make, fake_lepton: FakeLepton, field: str
) -> None:
    cfg = lepton_cfg(**{field: "gpu.1xh100-sxm"})
    with pytest.raises(
        ConfigError, match=f"backend.{field}: workspace 'ws-test' has no resource shape 'gpu.1xh100-sxm'"
    ):
        serving(cfg).create_or_update(cfg)
    assert fake_lepton.deployments == {} and fake_lepton.jobs == {}
    default = SwarmConfig.model_validate(
        {"name": "x", "model": "m", "backend": {"type": "lepton", "workspace_id": "w"}}
    )
    assert default.backend.resource_shape in fake_lepton.shapes  # type: ignore[union-attr]


@pytest.mark.parametrize("fake_lepton", [{"restart_crashed": True}], indirect=True)
def test_a_crash_loop_fails_readiness_long_before_the_timeout(
    lepton_cfg: Make, fake_lepton: FakeLepton, known_status: Callable[..., Any]
) -> None:
    fake_lepton.fail_deployments = ("broken",)
    cfg = lepton_cfg(name="broken")
    srv = serving(cfg)
    h = srv.create_or_update(cfg)
    assert known_status(srv, h).phase is ServingPhase.INITIALIZING  # Lepton restarts it: never Error
    t0 = time.monotonic()
    with pytest.raises(ReadinessError, match=r"is crash-looping: replica .* exited 3 times") as err:
        srv.wait_ready(h, timeout_s=600)
    assert time.monotonic() - t0 < 15
    assert "injected failure" in str(err.value)
    srv.delete(h)


def test_a_misspelt_endpoint_token_secret_is_refused_before_anything_starts(
    lepton_cfg: Make, fake_lepton: FakeLepton
) -> None:
    fake_lepton.secrets["ENDPOINT_TOKEN"] = "secret-held-by-lepton"
    cfg = lepton_cfg(api_key=None, endpoint_token_secret="ENDPOINT_TOKN")
    with pytest.raises(ConfigError, match=r"backend.endpoint_token_secret: workspace 'ws-test' has no secret"):
        serving(cfg).create_or_update(cfg)
    assert fake_lepton.deployments == {} and fake_lepton.jobs == {}
