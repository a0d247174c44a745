"""Slurm's job and step state names (squeue/sacct, long and short forms) as JobStatus values."""

from __future__ import annotations

from prefect_swarm.interfaces.types import JobStatus, coerce_job_status

SLURM_STATES: dict[str, JobStatus] = {
    "pd": JobStatus.PENDING,
    "configuring": JobStatus.PENDING,
    "cf": JobStatus.PENDING,
    "requeued": JobStatus.PENDING,
    "resv_del_hold": JobStatus.PENDING,
    "requeue_hold": JobStatus.PENDING,
    "requeue_fed": JobStatus.PENDING,
    "suspended": JobStatus.PENDING,
    "s": JobStatus.PENDING,
    "r": JobStatus.RUNNING,
    "completing": JobStatus.RUNNING,
    "cg": JobStatus.RUNNING,
    "stage_out": JobStatus.RUNNING,
    "signaling": JobStatus.RUNNING,
    "resizing": JobStatus.RUNNING,
    "cd": JobStatus.SUCCEEDED,
    "f": JobStatus.FAILED,
    "timeout": JobStatus.FAILED,
    "to": JobStatus.FAILED,
    "node_fail": JobStatus.FAILED,
    "nf": JobStatus.FAILED,
    "out_of_memory": JobStatus.FAILED,
    "oom": JobStatus.FAILED,
    "boot_fail": JobStatus.FAILED,
    "bf": JobStatus.FAILED,
    "deadline": JobStatus.FAILED,
    "dl": JobStatus.FAILED,
    "preempted": JobStatus.PREEMPTED,
    "pr": JobStatus.PREEMPTED,
    "revoked": JobStatus.FAILED,
    "ca": JobStatus.CANCELLED,
}
"""Slurm states the generic names of :func:`coerce_job_status` do not cover, lower case."""


def slurm_job_status(raw: str | None) -> JobStatus:
    """A Slurm state as squeue or sacct print it (``CANCELLED by 0``, ``PD``, ``TIMEOUT``...);
    ValueError for a state this table does not know."""
    return coerce_job_status(raw, SLURM_STATES)
