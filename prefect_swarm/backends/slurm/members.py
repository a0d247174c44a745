"""Replica membership: which array tasks a swarm wants, and putting back the ones that left the queue.

The replicas are array tasks named ``psw-<swarm>-replicas``; they need not share one array job id.
``slurm.json`` (``SwarmPaths.slurm_record``) holds ``array_tasks`` (how many the swarm wants) and
``tasks`` (task index -> ``jobid_task`` now serving it). A missing task index is resubmitted on
its own (``sbatch --array=<i>`` of the same script), so the others keep running and keep their ids.
Both ``up`` and the reconciler in the LB job call :func:`replenish`, under ``slurm.lock``;
``delete`` sets ``array_tasks`` to 0 first, so nothing is resubmitted behind it.

The LB job is replaced the same way, from the other side: every replica task runs
``python -m prefect_swarm.backends.slurm.members --keep-lb`` (:func:`keep_lb`), which resubmits
the LB job when it left the queue (one check per ``KEEP_LB_S`` for the whole swarm, under the
lock). When the LB cannot be replaced (its budget of ``MAX_RESUBMITS`` is spent, or the swarm's
life is over) the swarm is stopped -- no replica keeps its GPUs without an endpoint -- and
``stopped`` in the record says why (``status`` shows it).

``backend.time_limit`` bounds the swarm's life: ``ends_at`` (``up``'s submission + the time
limit) is recorded, a replacement gets only the time left (``--time``), and nothing is replaced
with less than ``min_life_s`` (``SlurmConfig.ending_s``: the signal may already be on its way) left.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from prefect_swarm.backends.slurm.client import QueueEntry, SlurmClient
from prefect_swarm.exceptions import AccessError
from prefect_swarm.paths import SwarmPaths, atomic_write_json, file_lock, private_dir, private_umask, read_json

log = logging.getLogger("prefect_swarm.slurm.members")

LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})
"""Queue states of a job that is (or will be) there."""

MAX_RESUBMITS = 5
"""Resubmissions per task index (and of the LB job) over a swarm's life; past it the task stays
missing (status says why) and a lost LB stops the swarm."""
MAX_START_FAILURES = 2
"""A replica task that left the queue this many times in a row before any of its replicas became
healthy (Ray that cannot start, a node that cannot run it) is not resubmitted again: the same
failure would only take another allocation (status says why, `up` starts it afresh)."""
KEEP_LB_S = 10.0
"""How often (for the whole swarm) a replica task looks whether the LB job is still queued (one squeue call)."""


def life_left(record: Mapping[str, Any], now: float | None = None) -> float | None:
    """Seconds until ``backend.time_limit`` ends the swarm (``ends_at``); None when not recorded."""
    ends = record.get("ends_at")
    return None if ends is None else float(ends) - (time.time() if now is None else now)


def no_replacement(record: Mapping[str, Any], key: str) -> str:
    """Why nothing may be resubmitted for ``key`` (a task index or ``"lb"``), or ''."""
    if int((record.get("resubmits") or {}).get(key, 0)) >= MAX_RESUBMITS:
        return f"it was already resubmitted {MAX_RESUBMITS} times (the most)"
    if int((record.get("start_failures") or {}).get(key, 0)) >= MAX_START_FAILURES:
        return (
            f"it ended {MAX_START_FAILURES} times in a row before any of its replicas became healthy (see their "
            "replica and rank logs); `prefect-swarm up` starts it afresh"
        )
    left = life_left(record)
    if left is not None and left < float(record.get("min_life_s") or 0.0):
        return f"the swarm's life (backend.time_limit) ends in {max(left, 0):.0f}s"
    return ""


def time_args(record: Mapping[str, Any]) -> list[str]:
    """``--time=<whole minutes left>`` for a replacement (Slurm counts minutes), or nothing."""
    left = life_left(record)
    return [] if left is None else [f"--time={max(1, int(left // 60))}"]


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


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def script_digests(scripts: Mapping[Path, str]) -> dict[str, str]:
    """``{file name: sha256}`` of the batch scripts ``up`` wrote (kept in ``slurm.json``, see :func:`script_text`)."""
    return {path.name: _digest(text) for path, text in scripts.items()}


def script_text(paths: SwarmPaths, record: Mapping[str, Any], script: Path) -> str:
    """The text of the batch script ``script`` that a resubmission hands to sbatch, read once and
    checked: the swarm folder is still this user's alone (:func:`~prefect_swarm.paths.private_dir`)
    and the text is the one ``up`` rendered from the config (its digest in ``slurm.json``). A script
    that differs is never submitted: :class:`~prefect_swarm.exceptions.AccessError` says why."""
    private_dir(paths.root)
    fd = os.open(script, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, encoding="utf-8") as fh:
        text = fh.read()
    want = (record.get("scripts") or {}).get(script.name)
    if want != _digest(text):
        raise AccessError(
            f"{script} is not the script `up` wrote for this swarm (its digest differs from slurm.json's): "
            "not submitted. Someone changed it; `prefect-swarm down` the swarm, check who could write "
            f"{paths.root}, and `up` again (it renders the scripts from the config)."
        )
    return text


def submit_tasks(
    client: SlurmClient,
    paths: SwarmPaths,
    record: dict[str, Any],
    tasks: Sequence[int],
    env: Mapping[str, str] | None,
    what: str,
    extra: Sequence[str] = (),
    script: str | None = None,
) -> str:
    """``sbatch --array=<tasks>`` of the replica script; records each task's new id. Returns a job id.

    ``script``: its text as ``up`` just rendered it; else the file, checked (:func:`script_text`).

    A task with its own resources in ``record["task_args"]`` (a last task running fewer replicas)
    is submitted on its own with them.
    """
    special: dict[str, list[str]] = record.get("task_args") or {}
    groups: list[tuple[list[int], list[str]]] = []
    plain = [t for t in tasks if str(t) not in special]
    if plain:
        groups.append((plain, list(extra)))
    groups += [([t], [*special[str(t)], *extra]) for t in tasks if str(t) in special]
    ids = record.setdefault("tasks", {})
    submitted = record.setdefault("submitted", {})
    job_id = ""
    text = script if script is not None else script_text(paths, record, paths.replicas_script)
    for group, extra in groups:
        array = f"--array={','.join(map(str, group))}"
        job_id = client.sbatch(text, env=env, what=what, args=[array, *extra])
        for t in group:
            ids[str(t)] = f"{job_id}_{t}"
            submitted[str(t)] = time.time()
    return job_id


def came_up(paths: SwarmPaths, record: Mapping[str, Any], task: int) -> bool:
    """Whether a replica of array task ``task`` became healthy since the task was last submitted (its
    watchdog's status says so for a start after that); True when the record does not say when."""
    since = (record.get("submitted") or {}).get(str(task))
    if since is None:
        return True
    per_task = int(record.get("per_task") or 1)
    for i in range(task * per_task, min((task + 1) * per_task, int(record.get("replicas") or 0))):
        status = read_json(paths.replica_status(i), {}) or {}
        if status.get("ever_healthy") and float(status.get("started_at") or 0) >= float(since):
            return True
    return False


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
    failures: dict[str, int] = record.setdefault("start_failures", {})
    missing = []
    for t in range(want):
        key = str(t)
        if t in live or t in skip or no_replacement(record, key):
            continue
        failures[key] = 0 if came_up(paths, record, t) else failures.get(key, 0) + 1
        why = no_replacement(record, key)
        if why:
            log.error("replica task %d left the queue and is not resubmitted: %s", t, why)
            continue
        missing.append(t)
    if not missing:
        if any(failures.values()):
            atomic_write_json(paths.slurm_record, record)
        return []
    per_task = int(record.get("per_task") or 1)
    for t in missing:
        counts[str(t)] = counts.get(str(t), 0) + 1
        for i in range(t * per_task, (t + 1) * per_task):
            paths.replica_head(i).unlink(missing_ok=True)
    try:
        job_id = submit_tasks(
            client, paths, record, missing, env, f"resubmit replica task(s) {missing}", extra=time_args(record)
        )
    except AccessError as exc:
        stop_swarm(client, paths, name, f"replica task(s) {missing} left the queue and are not resubmitted: {exc}")
        return []
    record["replenished_at"] = time.time()
    atomic_write_json(paths.slurm_record, record)
    log.info("replica task(s) %s had left the queue: resubmitted as job %s", missing, job_id)
    return missing


def stop_swarm(client: SlurmClient, paths: SwarmPaths, replicas_name: str, reason: str) -> None:
    """Stop the swarm from inside (call under :func:`locked`): want no replica, record why, cancel
    its replica tasks (this process's own task among them)."""
    record = read_json(paths.slurm_record, {}) or {}
    record.update(array_tasks=0, stopped={"at": time.time(), "reason": reason})
    atomic_write_json(paths.slurm_record, record)
    log.error("stopping the swarm: %s", reason)
    client.scancel(sorted({e.array_job_id for e in client.squeue(names=[replicas_name])}))


def keep_lb(client: SlurmClient, paths: SwarmPaths, lb_name: str, replicas_name: str, env: Mapping[str, str]) -> str:
    """Resubmit the LB job when it left the queue (call under :func:`locked`); when it may not be
    replaced, stop the swarm. Returns what was done ('' when nothing)."""
    record = read_json(paths.slurm_record, {}) or {}
    if int(record.get("array_tasks") or 0) <= 0 or not paths.lb_script.is_file():
        return ""
    if time.time() - float(record.get("lb_checked_at") or 0) < KEEP_LB_S:
        return ""  # another replica task looked just now
    record["lb_checked_at"] = time.time()
    atomic_write_json(paths.slurm_record, record)
    if any(e.state in LIVE_STATES - {"COMPLETING"} for e in client.squeue(names=[lb_name])):
        return ""
    why = no_replacement(record, "lb")
    if why:
        stop_swarm(
            client,
            paths,
            replicas_name,
            f"the load balancer job {record.get('lb_job')} left the queue "
            f"and is not replaced: {why}; no replica keeps its GPUs without an endpoint",
        )
        return "stopped"
    counts: dict[str, int] = record.setdefault("resubmits", {})
    counts["lb"] = counts.get("lb", 0) + 1
    paths.lb_head.unlink(missing_ok=True)
    try:
        text = script_text(paths, record, paths.lb_script)
    except AccessError as exc:
        stop_swarm(client, paths, replicas_name, f"the load balancer job left the queue and is not replaced: {exc}")
        return "stopped"
    job_id = client.sbatch(text, env=env, what="replace the load balancer", args=time_args(record))
    old, record["lb_job"] = record.get("lb_job"), job_id
    atomic_write_json(paths.slurm_record, record)
    log.warning("the load balancer job %s had left the queue: resubmitted as job %s", old, job_id)
    return job_id


def main(argv: list[str] | None = None) -> int:
    """``--keep-lb``: the loop a replica task runs beside its replicas (see the module docstring)."""
    from prefect_swarm.backends.slurm.client import clean_env

    ap = argparse.ArgumentParser(description="Resubmit a swarm's LB job when it left the Slurm queue.")
    ap.add_argument("--keep-lb", action="store_true", required=True)
    ap.add_argument("--swarm-dir", required=True, type=Path)
    ap.add_argument("--lb-job-name", required=True)
    ap.add_argument("--replicas-job-name", required=True)
    ap.add_argument("--parent", type=int, default=None, help="exit when this process is gone")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    paths = SwarmPaths(args.swarm_dir)
    client = SlurmClient(timeout_s=30.0)
    while not args.parent or os.getppid() == args.parent:
        try:
            with locked(paths):
                if keep_lb(client, paths, args.lb_job_name, args.replicas_job_name, clean_env()) == "stopped":
                    return 0
        except Exception:  # a slow controller must not end the replica task
            log.exception("LB check failed; retrying")
        time.sleep(KEEP_LB_S)
    return 0


if __name__ == "__main__":
    private_umask()  # the process entry point only: a test calling main() keeps its umask
    sys.exit(main())
