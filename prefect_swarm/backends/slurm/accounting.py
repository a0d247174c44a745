"""GPU-hours of a swarm's Slurm jobs from the accounting database (``sacct``).

One allocation line per job or array task (``-X``: steps share their job's allocation and would
count it twice): ``ElapsedRaw`` seconds x the GPUs in ``AllocTRES`` (``gres/gpu=N``, or
``gres/gpu:<type>=N``), summed. A job still running counts its elapsed time so far.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect_swarm.backends.slurm.client import SlurmClient
from prefect_swarm.paths import SwarmPaths, read_json

ACCT_FIELDS = "JobID,ElapsedRaw,AllocTRES"
_GPU_TRES = re.compile(r"(?:^|,)gres/(?P<name>[^=,:]+)(?::[^=,]*)?=(?P<n>\d+)")


@dataclass(frozen=True)
class Allocation:
    """One job's (or array task's) allocation: its id, elapsed seconds and GPUs."""

    id: str
    elapsed_s: int
    gpus: int

    @property
    def gpu_hours(self) -> float:
        """Elapsed hours x GPUs."""
        return self.elapsed_s * self.gpus / 3600.0


def gpus_of(tres: str, gres_name: str = "gpu") -> int:
    """GPUs in an ``AllocTRES`` string (``cpu=2,gres/gpu=1,mem=1G,node=1``); 0 when none.

    A typed count (``gres/gpu:a100=2``) is the same GPUs as the untyped one sacct lists beside it,
    so the largest count of ``gres_name`` is taken, not the sum.
    """
    counts = [int(m.group("n")) for m in _GPU_TRES.finditer(tres) if m.group("name") == gres_name]
    return max(counts, default=0)


def allocations(client: SlurmClient, ids: Sequence[str], gres_name: str = "gpu") -> list[Allocation]:
    """The allocations of jobs ``ids`` (an array job's id lists all its tasks), one per job id."""
    if not ids:
        return []
    out = client.run(
        ["sacct", "-n", "-P", "-X", "-j", ",".join(sorted(set(ids))), "-o", ACCT_FIELDS],
        what="read the swarm's GPU time",
        ok_gone=True,
    )
    found: dict[str, Allocation] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        found[parts[0]] = Allocation(parts[0], int(parts[1]), gpus_of(parts[2], gres_name))
    return list(found.values())


def gpu_hours(client: SlurmClient, ids: Sequence[str], gres_name: str = "gpu") -> float:
    """GPU-hours of jobs ``ids`` so far."""
    return sum(a.gpu_hours for a in allocations(client, ids, gres_name))


def swarm_gpu_hours(
    client: SlurmClient, paths: SwarmPaths, gres_name: str = "gpu", meta: Mapping[str, Any] | None = None
) -> float:
    """The swarm's GPU-hours so far: its replica and LB jobs and every resubmitted task, as its
    ``slurm.json`` record (and a handle's ``meta``) name them. ``gpu_usage`` reports this figure and
    the LB job holds the swarm's budget to it."""
    record = read_json(paths.slurm_record, {}) or {}
    found = [m for m in (meta, record) if m]
    ids = {str(m[k]) for m in found for k in ("replicas_job", "lb_job") if m.get(k)}
    ids |= {str(v) for m in found for v in (m.get("tasks") or {}).values()}
    return gpu_hours(client, sorted(ids), gres_name)


__all__ = ["Allocation", "allocations", "gpu_hours", "gpus_of", "swarm_gpu_hours"]
