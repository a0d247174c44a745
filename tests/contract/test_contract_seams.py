"""The declared seams every backend implements: ``validate(cfg)``, ``plan()`` and ``job_runtime()``.

``validate`` and ``plan`` are what ``prefect-swarm validate`` runs: they start nothing, write no
swarm folder, call nothing remote and need no credentials; the plan never holds a secret.
``job_runtime`` names an interpreter that exists where the backend runs jobs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from contract_kit import BackendFactory

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ComputeBackend, JobRequest, JobStatus, ServingBackend
from prefect_swarm.swarm import Swarm

SECRET = "sk-plan-must-not-show-7f1e"
_TOKENS = ("PSW_CONTRACT_LEPTON_TOKEN", "LEPTON_WORKSPACE_TOKEN")


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """No workspace token anywhere in the environment (Lepton reads its token from there)."""
    for name in _TOKENS:
        monkeypatch.delenv(name, raising=False)


def _config(factory: BackendFactory) -> SwarmConfig:
    return factory.config(replicas=2, api_key=SECRET)


def test_backends_implement_the_declared_seams(factory: BackendFactory) -> None:
    swarm = Swarm(_config(factory))
    assert isinstance(swarm.backends.serving, ServingBackend)
    assert isinstance(swarm.backends.compute(None), ComputeBackend)


@pytest.mark.usefixtures("no_token")
def test_validate_and_plan_start_nothing_and_need_no_token(factory: BackendFactory) -> None:
    cfg = _config(factory)
    swarm = Swarm(cfg)
    requests_before = _remote_requests(factory)
    swarm.validate()
    swarm.backends.serving.validate(cfg)
    plan = swarm.backends.serving.plan()
    assert plan and all(isinstance(k, str) and isinstance(v, str) and v for k, v in plan.items())
    assert any(cfg.model in text for text in plan.values()), "the plan shows the engine command"
    assert not any(SECRET in text for text in plan.values()), "a secret reached the plan"
    assert _remote_requests(factory) == requests_before, "validate/plan called the backend"
    assert not swarm.paths.root.exists(), "validate/plan wrote the swarm folder"
    assert factory.leftovers(swarm) == []


def test_job_runtime_python_runs_jobs_where_the_backend_runs_them(up: Callable[..., Swarm]) -> None:
    swarm = up(replicas=1, ready=False)
    runtime = swarm.compute.job_runtime()
    assert runtime.python and all(isinstance(v, str) for v in runtime.env.values())
    command = runtime.module_argv("prefect_swarm.interfaces.jobenv")
    assert command == [runtime.python, "-m", "prefect_swarm.interfaces.jobenv"]
    job = swarm.compute.submit(JobRequest(name="runtime", command=command, detach=False))
    assert swarm.compute.probe(job).status is JobStatus.SUCCEEDED


def _remote_requests(factory: BackendFactory) -> int:
    """Requests the backend's remote side has seen (the fake Lepton's log; 0 elsewhere)."""
    if factory.name != "lepton":
        return 0
    from contract_kit import _lepton_fake

    return len(_lepton_fake().requests)


def test_sleep_and_wake_are_offered_or_refused_with_the_reason_before_anything_is_called(
    factory: BackendFactory,
) -> None:
    import re

    from prefect_swarm.exceptions import ConfigError
    from prefect_swarm.interfaces import Capability, ServingHandle

    swarm = Swarm(_config(factory))  # an engine without sleep mode
    serving = swarm.backends.serving
    caps = serving.capabilities()
    handle = ServingHandle(swarm.cfg.name, swarm.cfg.backend.type)
    requests_before = _remote_requests(factory)
    why = (
        r"engine\.sleep_mode"
        if caps.supports(Capability.SLEEP_WAKE)
        else re.escape(caps.missing[Capability.SLEEP_WAKE])
    )
    with pytest.raises(ConfigError, match=why):
        serving.sleep(handle, [0])
    with pytest.raises(ConfigError, match=why):
        serving.wake(handle, [0])
    assert _remote_requests(factory) == requests_before, "a refused sleep called the backend"
    assert not swarm.paths.root.exists(), "a refused sleep wrote the swarm folder"
