"""The two-node test Slurm is real, and a real Ray cluster forms across its nodes in one allocation.

Ground for multi-node replicas (vLLM over Ray): an ``sbatch --nodes=2`` job starts a Ray head on
node1 and a Ray worker on node2 (scripts/slurm/two-node/ray-check.sbatch), waits for two alive Ray
nodes, and stops Ray on both; the test then looks into each node's process namespace itself.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from _twonode import NODES, SCRIPTS, TwoNodeCluster

from prefect_swarm.testing.waiting import WaitTimedOut, wait_until

pytestmark = [pytest.mark.slurm_multinode, pytest.mark.slow]

RAY_CHECK = SCRIPTS / "two-node" / "ray-check.sbatch"
RAY_PROGRAM = re.compile(rb"raylet|gcs_server|ray::|ray/_private|ray/dashboard|ray/autoscaler|default_worker")
"""Command lines of Ray's processes (daemons, agents, workers)."""


def wait_job(cluster: TwoNodeCluster, job_id: str, timeout: float) -> dict[str, str]:
    """Wait until the job has left the queue; its `scontrol show job` fields."""
    try:
        wait_until(
            f"job {job_id} to leave the queue",
            lambda: cluster.slurm("squeue", "-h", "-j", job_id).stdout.strip(),
            until=lambda queued: not queued,
            timeout_s=timeout,
            poll_s=0.5,
        )
    except WaitTimedOut:
        cluster.slurm("scancel", job_id)
        raise
    fields = cluster.slurm("scontrol", "show", "job", "-o", job_id).stdout.split()
    return dict(f.split("=", 1) for f in fields if "=" in f)


def ray_processes(cluster: TwoNodeCluster, node: str) -> list[str]:
    """Command lines of the Ray processes running on ``node`` (seen from outside the node)."""
    return cluster.processes(node, RAY_PROGRAM)


def test_sinfo_shows_two_idle_nodes(two_node_cluster: TwoNodeCluster) -> None:
    out = two_node_cluster.slurm("sinfo", "-h", "-N", "-o", "%N %T %G").stdout.split("\n")
    rows = sorted({line.strip() for line in out if line.strip()})
    assert [r.split()[:2] for r in rows] == [[n, "idle"] for n in NODES], rows
    assert all("gpu:" in r for r in rows), rows


def test_ray_cluster_forms_across_both_nodes(two_node_cluster: TwoNodeCluster, tmp_path: Path) -> None:
    out_file = tmp_path / "ray-check.out"
    submitted = two_node_cluster.slurm(
        "sbatch", "--parsable", f"--output={out_file}", f"--export=ALL,RAY_PYTHON={sys.executable}", str(RAY_CHECK)
    )
    job_id = submitted.stdout.strip().split(";")[0]
    job = wait_job(two_node_cluster, job_id, timeout=240)
    output = out_file.read_text()

    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", output
    assert job["NodeList"] == "node[1-2]", job
    alive = re.search(r"^RAY_ALIVE_NODES (\d+) (.*) gpus=(\d+)$", output, re.M)
    assert alive, output
    assert int(alive.group(1)) == 2, output
    assert alive.group(2).split() == [two_node_cluster.address(n) for n in NODES], output  # Ray bound to the bridge
    assert int(alive.group(3)) == 2, output  # one Slurm GPU per node, as Ray counts them
    assert re.findall(r"^RAY_LEFT (\S+) (\d+)$", output, re.M) == [("node1", "0"), ("node2", "0")], output
    for node in NODES:
        assert ray_processes(two_node_cluster, node) == [], node
