"""Every Lepton deployment and job state maps to one of ours (tables checked against the SDK's enums)."""

from __future__ import annotations

import pytest

from prefect_swarm.backends.lepton.compute import JOB_STATUSES, job_names, job_status
from prefect_swarm.backends.lepton.serving import DEPLOYMENT_PHASES, deployment_phase
from prefect_swarm.interfaces import JobStatus, ServingPhase

DEPLOYMENT_TABLE = [
    ("Ready", None, ServingPhase.RUNNING),
    ("Migrating", None, ServingPhase.RUNNING),
    ("Not Ready", None, ServingPhase.INITIALIZING),
    ("Not Ready", "Stopping", ServingPhase.STOPPED),
    ("Not Ready", "Stopped", ServingPhase.STOPPED),
    ("Starting", None, ServingPhase.INITIALIZING),
    ("Updating", None, ServingPhase.INITIALIZING),
    ("Scaling", None, ServingPhase.INITIALIZING),
    ("Restarting", None, ServingPhase.INITIALIZING),
    ("Stopping", None, ServingPhase.STOPPED),
    ("Stopped", None, ServingPhase.STOPPED),
    ("Deleting", None, ServingPhase.STOPPED),
    ("Error", None, ServingPhase.FAILED),
    ("UNK", None, ServingPhase.UNKNOWN),
    ("SomethingNew", None, ServingPhase.UNKNOWN),
    (None, None, ServingPhase.UNKNOWN),
]

JOB_TABLE = [
    ("Starting", 0, 0, JobStatus.PENDING),
    ("Queueing", 0, 0, JobStatus.PENDING),
    ("Awaiting", 0, 0, JobStatus.PENDING),
    ("PendingRetry", 0, 1, JobStatus.PENDING),
    ("Running", 0, 0, JobStatus.RUNNING),
    ("Restarting", 0, 0, JobStatus.RUNNING),
    ("Stopping", 0, 0, JobStatus.RUNNING),
    ("Terminating", 0, 0, JobStatus.RUNNING),
    ("Deleting", 0, 0, JobStatus.RUNNING),
    ("Completed", 1, 0, JobStatus.SUCCEEDED),
    ("Failed", 0, 1, JobStatus.FAILED),
    ("Stopped", 0, 0, JobStatus.CANCELLED),
    ("Deleted", 0, 0, JobStatus.CANCELLED),
    ("Archived", 1, 0, JobStatus.SUCCEEDED),
    ("Archived", 0, 1, JobStatus.FAILED),
    ("Archived", 0, 0, None),
    ("UNK", 0, 0, None),
    (None, 0, 0, None),
]


@pytest.mark.parametrize(("state", "phase", "expected"), DEPLOYMENT_TABLE)
def test_deployment_state_table(state: str | None, phase: str | None, expected: ServingPhase) -> None:
    assert deployment_phase(state, phase) is expected


@pytest.mark.parametrize(("state", "succeeded", "failed", "expected"), JOB_TABLE)
def test_job_state_table(state: str | None, succeeded: int, failed: int, expected: JobStatus | None) -> None:
    assert job_status(state, succeeded, failed) is expected


@pytest.mark.lepton
def test_tables_cover_every_sdk_state(need_lepton_sdk: None) -> None:
    from leptonai.api.v2.types.deployment import LeptonDeploymentState
    from leptonai.api.v2.types.job import LeptonJobState

    assert {s.value for s in LeptonDeploymentState} == set(DEPLOYMENT_PHASES)
    assert {s.value for s in LeptonJobState} == set(JOB_STATUSES)
    assert {s.value for s in LeptonDeploymentState} <= {row[0] for row in DEPLOYMENT_TABLE}
    assert {s.value for s in LeptonJobState} <= {row[0] for row in JOB_TABLE}


def test_job_names_follow_lepton_rules() -> None:
    import re

    group, names = job_names("My Swarm/Job 2024_!! with a very long name indeed", 12, suffix="abc123")
    assert len(names) == 12 and group == names[0].rsplit("-", 1)[0]
    for n in names:
        assert re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", n) and len(n) <= 36, n
    assert job_names("123", 1, suffix="ff")[1] == ["j123-ff-0"]
