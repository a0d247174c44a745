"""Replica membership: which array tasks a swarm wants, and putting back the ones that left the queue.

The replicas are array tasks named ``psw-<swarm>-replicas``; they need not share one array job id.
``slurm.json`` (``SwarmPaths.slurm_record``) holds ``array_tasks`` (how many the swarm wants) and
``tasks`` (task index -> ``jobid_task`` now serving it). A missing task index is resubmitted on
its own (``sbatch --array=<i>`` of the same script), so the others keep running and keep their ids.
Both ``up`` and the reconciler in the LB job call :func:`replenish`, under ``slurm.lock``;
``delete`` sets ``array_tasks`` to 0 first, so nothing is resubmitted behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from prefect_swarm.backends.slurm.client import QueueEntry, SlurmClient
from prefect_swarm.paths import SwarmPaths, atomic_write_json, file_lock, read_json

log = logging.getLogger("prefect_swarm.slurm.members")

LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})
"""Queue states of a job that is (or will be) there."""

MAX_RESUBMITS = 5
"""Resubmissions per task index over a swarm's life; past it the task stays missing (status says why)."""


def locked(paths: SwarmPaths) -> AbstractContextManager[None]:
    """Hold ``slurm.lock`` (exclusive) while reading and changing the replica tasks."""
    return file_lock(paths.slurm_lock)


def live_tasks(client: SlurmClient, name: str) -> dict[int, QueueEntry]:
    """Task index -> queue entry of every live array task named ``name`` (one that is COMPLETING is
    on its way out: it counts as missing)."""
    out: dict[int, QueueEntry] = {}
    for entry in client.squeue(names=[name]):
        if entry.state in LIVE_STATES - {"COMPLETING"} and entry.task_id is not None and entry.task_id.isdigit():
            out[int(entry.task_id)] = entry
    return out


def submit_tasks(
    client: SlurmClient,
    paths: SwarmPaths,
    record: dict[str, Any],
    tasks: Sequence[int],
    env: Mapping[str, str] | None,
    what: str,
) -> str:
    """``sbatch --array=<tasks>`` of the replica script; records each task's new id. Returns a job id.

    A task with its own resources in ``record["task_args"]`` (a last task running fewer replicas)
    is submitted on its own with them.
    """
    special: dict[str, list[str]] = record.get("task_args") or {}
    groups: list[tuple[list[int], list[str]]] = []
    plain = [t for t in tasks if str(t) not in special]
    if plain:
        groups.append((plain, []))
    groups += [([t], list(special[str(t)])) for t in tasks if str(t) in special]
    ids = record.setdefault("tasks", {})
    job_id = ""
    for group, extra in groups:
        array = f"--array={','.join(map(str, group))}"
        job_id = client.sbatch(paths.replicas_script, env=env, what=what, args=[array, *extra])
        for t in group:
            ids[str(t)] = f"{job_id}_{t}"
    return job_id


def replenish(
    client: SlurmClient,
    paths: SwarmPaths,
    name: str,
    env: Mapping[str, str] | None = None,
    skip: Collection[int] = (),
) -> list[int]:
    """Resubmit every wanted task index that is not in the queue; returns the indices resubmitted.

    Call under :func:`locked`. Indices in ``skip``, and one resubmitted ``MAX_RESUBMITS`` times,
    are left alone.
    """
    record = read_json(paths.slurm_record, {}) or {}
    want = int(record.get("array_tasks") or 0)
    if want <= 0:
        return []
    live = live_tasks(client, name)
    counts: dict[str, int] = record.setdefault("resubmits", {})
    missing = [t for t in range(want) if t not in live and t not in skip and counts.get(str(t), 0) < MAX_RESUBMITS]
    if not missing:
        return []
    per_task = int(record.get("per_task") or 1)
    for t in missing:
        counts[str(t)] = counts.get(str(t), 0) + 1
        for i in range(t * per_task, (t + 1) * per_task):
            paths.replica_head(i).unlink(missing_ok=True)
    job_id = submit_tasks(client, paths, record, missing, env, f"resubmit replica task(s) {missing}")
    record["replenished_at"] = time.time()
    atomic_write_json(paths.slurm_record, record)
    log.info("replica task(s) %s had left the queue: resubmitted as job %s", missing, job_id)
    return missing
