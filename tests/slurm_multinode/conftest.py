"""Fixtures of the multi-node Slurm tests: the two-node test cluster of scripts/slurm/two-node-up.sh.

The cluster is its own Slurm (own slurmctld, ports, state; clients pick it with SLURM_CONF) next to
the single-node one the other Slurm tests use; each node is a slurmd in its own network, UTS, mount
and PID namespace. The session fixture starts it when it is not up and stops it at the end only
when it started it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import services
from _twonode import NODES, SCRIPTS, TwoNodeCluster


def _script(name: str, cluster_dir: Path, timeout: float) -> None:
    env = {**os.environ, "SLURM_2NODE_DIR": str(cluster_dir)}
    out = subprocess.run(["bash", str(SCRIPTS / name)], capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        pytest.fail(f"scripts/slurm/{name} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}", pytrace=False)


def _was_up(cluster_dir: Path) -> bool:
    """Every machine's PID 1 from the pid files still runs."""
    for machine in ("ctl", *NODES):
        pid_file = cluster_dir / "run" / f"{machine}.pid"
        try:
            pid = int(pid_file.read_text())
            if b"node-init" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return False
        except (OSError, ValueError):
            return False
    return True


@pytest.fixture(scope="session")
def two_node_cluster() -> Iterator[TwoNodeCluster]:
    """The two-node test cluster, started here when it is not up (and then stopped at the end)."""
    services.gate(services.missing_two_node_slurm())
    cluster_dir = Path(os.environ.get("SLURM_2NODE_DIR", "/var/lib/slurm-2node"))
    started = not _was_up(cluster_dir)
    try:
        _script("two-node-up.sh", cluster_dir, timeout=120)  # idempotent: checks the nodes are ready
    except BaseException:
        if started:  # leave no half-up cluster (namespaces, daemons) behind
            _script("two-node-down.sh", cluster_dir, timeout=120)
        raise
    try:
        yield TwoNodeCluster(cluster_dir)
    finally:
        if started:
            _script("two-node-down.sh", cluster_dir, timeout=120)
