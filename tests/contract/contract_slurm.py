"""The Slurm factory of the contract suite (register it with ``FACTORIES["slurm"] = SLURM`` in contract_kit).

Kept in its own file so the Slurm work package does not edit the suite's kit; see the note in
the Slurm backend's report for the one line that registers it.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from contract_kit import BackendFactory
from services import gate, missing_nginx, missing_slurm

from prefect_swarm.swarm import Swarm
from prefect_swarm.testing import free_port_block


def slurm_backend() -> dict[str, Any]:
    """One CPU per replica (8 declared CPUs on the test node), a free LB port, a short queue timeout."""
    return {
        "type": "slurm",
        "cpus_per_replica": 1,
        "lb_port": free_port_block(1),
        "queue_timeout_s": 60,
        "time_limit": "30:00",
        # the suite's clients send no key; the closed endpoint (the default) is tested in tests/slurm
        "open_endpoint": True,
    }


def slurm_leftovers(swarm: Swarm) -> list[str]:
    """This swarm's jobs still in the Slurm queue (COMPLETING included)."""
    names = f"psw-{swarm.cfg.name}-replicas,psw-{swarm.cfg.name}-lb"
    out = subprocess.run(["squeue", "-h", "-r", "-n", names, "-o", "%i %j %T"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def _gate() -> None:
    gate(missing_slurm() or missing_nginx())


SLURM = BackendFactory(
    name="slurm",
    backend=slurm_backend,
    leftovers=slurm_leftovers,
    gate=_gate,
    marks=[pytest.mark.slurm],
    ready_timeout_s=90.0,
    status_budget_s=2.0,
    stop_timeout_s=60.0,
)
