"""Helpers of the Slurm backend tests (imported as ``_slurmkit``): stub-engine configs, live swarms."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from prefect_swarm.backends.slurm.serving import SlurmServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ServingHandle
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing import free_port_block
from prefect_swarm.testing.stub_engine import engine_command

STUB_COMMAND = engine_command()


def unique_name(prefix: str = "t") -> str:
    """A swarm name no other test run on this shared Slurm uses (jobs are psw-<name>-...)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def stub_config(name: str | None = None, replicas: int = 2, **overrides: Any) -> SwarmConfig:
    """A Slurm swarm of stub engines, one CPU per replica, ports picked free now."""
    backend = {
        "type": "slurm",
        "cpus_per_replica": 1,
        "queue_timeout_s": 60,
        "time_limit": "30:00",
        "lb_port": free_port_block(1),
        **overrides.pop("backend", {}),
    }
    engine = {"kind": "command", "command": STUB_COMMAND, **overrides.pop("engine", {})}
    data = {
        "name": name or unique_name(),
        "model": "stub-model",
        "replicas": replicas,
        "gpus_per_replica": 1,
        "port": free_port_block(replicas),
        "engine": engine,
        "backend": backend,
        **overrides,
    }
    return SwarmConfig.model_validate(data)


def node_gpus() -> int:
    """The GPUs of the single test node (``sinfo``'s ``gpu:N``)."""
    gres = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"gpu:(\d+)", gres).group(1))  # type: ignore[union-attr]


def our_jobs(cfg: SwarmConfig) -> str:
    """squeue lines of this swarm's jobs (empty when none)."""
    names = f"psw-{cfg.name}-replicas,psw-{cfg.name}-lb"
    return subprocess.run(["squeue", "-h", "-n", names], capture_output=True, text=True).stdout.strip()


class LiveSwarm:
    """A swarm brought up for one test; ``down()`` is also called by the fixture on every exit path."""

    def __init__(self, cfg: SwarmConfig) -> None:
        self.cfg = cfg
        self.paths = SwarmPaths.for_swarm(cfg.name)
        self.serving = SlurmServing(cfg, self.paths)
        self.handle: ServingHandle | None = None

    def up(self, timeout_s: float = 120) -> ServingHandle:
        self.handle = self.serving.create_or_update(self.cfg)
        self.serving.wait_ready(self.handle, timeout_s)
        return self.handle

    def down(self) -> None:
        if self.handle is not None:
            self.serving.delete(self.handle)


PY = sys.executable


def make_job(tmp: Path, n: int, **fields: Any) -> Path:
    """A parquet dataset of ``n`` prompts and a job spec over it (job dir under ``tmp``); returns the spec."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table(
            {
                "id": [f"r{i:05d}" for i in range(n)],
                "prompt": [f"question {i} about topic {i % 13}" for i in range(n)],
            }
        ),
        tmp / "in.parquet",
        row_group_size=max(1, n // 8),
    )
    spec = {
        "input": str(tmp / "in.parquet"),
        "output": str(tmp / "out.parquet"),
        "job_dir": str(tmp / "job"),
        "id_column": "id",
        "concurrency": 16,
        "checkpoint_every": 20,
        "checkpoint_seconds": 1,
        "job_kwargs": {"sampling": {"max_tokens": 8, "temperature": 0}},
        **fields,
    }
    (tmp / "job").mkdir(parents=True, exist_ok=True)
    path = tmp / "job" / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def job_command(spec: Path) -> list[str]:
    """argv of the job process (shard arguments are appended by the compute backend)."""
    return [sys.executable, "-m", "prefect_swarm.jobs.run", "--spec", str(spec)]


def output_ids(tmp: Path) -> list[str]:
    """ids of the committed output, in order."""
    import pyarrow.parquet as pq

    return [str(x) for x in pq.read_table(tmp / "out.parquet", columns=["id"]).column("id").to_pylist()]


def nginx_locations(nginx_conf: Path) -> list[str]:
    """The paths of every ``location`` of a rendered nginx.conf (the LB's own routes)."""
    return re.findall(r"^\s*location\s+(?:=\s*)?(\S+)\s*\{", nginx_conf.read_text(), re.M)


def refused_without_key(bases: list[str], routes: list[tuple[str, str]], key: str) -> list[str]:
    """``METHOD base+route`` of each request that was NOT answered 401 without the key (no header, a wrong
    key, the key with a lowercase scheme, the key as X-Api-Key); empty when everything was refused."""
    wrong = ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": f"bearer {key}"}, {"X-Api-Key": key})
    leaks = []
    # a new connection per request: a kept-alive one the server closes as the next request goes out reads
    # "Server disconnected without sending a response" on a loaded machine
    with httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for base in bases:
            for method, route in routes:
                for headers in wrong:
                    resp = client.request(method, base + route, headers=headers, json={})
                    if resp.status_code != 401:
                        leaks.append(f"{method} {base}{route} {headers and list(headers)}: {resp.status_code}")
    return leaks
