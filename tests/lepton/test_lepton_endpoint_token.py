"""An endpoint token held in a workspace secret is verified at readiness with the key the swarm's
jobs send (the swarm's api_key); where no api_key says what it is, readiness says it cannot check."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.backends.lepton.serving import LeptonServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ReadinessError
from prefect_swarm.interfaces import JobRequest, JobStatus, ServingPhase
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]
SECRET = "swarm-endpoint-token"


def _serving(cfg: SwarmConfig) -> LeptonServing:
    return LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))


@pytest.mark.parametrize("fake_lepton", [{}, {"new_deployment_api": True}], indirect=True, ids=["legacy", "new-api"])
def test_a_wrong_secret_held_token_is_caught_at_readiness(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    fake_lepton.secrets[SECRET] = "an-old-token-nobody-uses"
    cfg = lepton_cfg(api_key="the-key-jobs-send", endpoint_token_secret=SECRET)
    srv = _serving(cfg)
    handle = srv.create_or_update(cfg)
    t0 = time.monotonic()
    with pytest.raises(ReadinessError, match=rf"refuses the swarm's api_key \(HTTP 401\).*secret '{SECRET}'") as err:
        srv.wait_ready(handle, timeout_s=600)
    assert time.monotonic() - t0 < 30  # a few refused probes, not the readiness timeout
    assert "the-key-jobs-send" not in str(err.value) and "an-old-token" not in str(err.value)
    # what it caught: a job's request with the key it is given is refused by the endpoint
    url = srv.status(handle).url or ""
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": "Bearer the-key-jobs-send"}
    assert httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10).status_code == 401
    srv.delete(handle)


def test_the_right_secret_held_token_passes_and_jobs_use_it(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    fake_lepton.secrets[SECRET] = "the-key-jobs-send"
    cfg = lepton_cfg(api_key="the-key-jobs-send", endpoint_token_secret=SECRET)
    srv = _serving(cfg)
    handle = srv.create_or_update(cfg)
    st = srv.wait_ready(handle, timeout_s=30)
    assert st.phase is ServingPhase.RUNNING and "chat completion answered" in st.detail
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), handle)
    job = compute.submit(JobRequest(name="k", command=["python3", "-c", "pass"]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    assert fake_lepton.job_env(job.id)["PREFECT_SWARM_API_KEY"] == "the-key-jobs-send"
    srv.delete(handle)


def test_without_api_key_the_token_is_unverified_and_says_so(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    fake_lepton.secrets[SECRET] = "only-lepton-knows"
    cfg = lepton_cfg(api_key=None, endpoint_token_secret=SECRET)
    srv = _serving(cfg)
    (warning,) = srv.validate(cfg)  # `prefect-swarm validate` shows it, and `up` logs it
    assert f"only in workspace secret '{SECRET}'" in warning and "Set api_key" in warning
    handle = srv.create_or_update(cfg)
    st = srv.wait_ready(handle, timeout_s=30)
    assert "chat probe skipped" in st.detail and "Set api_key" in st.detail
    srv.delete(handle)
