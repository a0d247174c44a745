"""A Slurm swarm on a shared cluster: closed by a key of its own, files in its run dir, only the
named environment on the nodes, offline Hugging Face, `scale`. Real single-node Slurm, stub
replicas, every command run as its own process (the CLI), as a user would."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from _slurmkit import make_job, output_ids, stub_config

from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BODY = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))


def _post(url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/v1/chat/completions", json=BODY, headers=headers, timeout=10).status_code


def _task_ids(doc: dict[str, Any]) -> list[str]:
    return [r["external_id"] for r in doc["status"]["replicas"]]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _files_holding(root: Path, needle: bytes, skip: set[Path]) -> list[str]:
    """Files holding ``needle``, but those in ``skip`` (the key's own files), which must be mode 0600."""
    found = []
    for path in root.rglob("*"):
        if path in skip:
            assert path.stat().st_mode & 0o777 == 0o600, path
        elif path.is_file() and needle in path.read_bytes():
            found.append(str(path))
    return found


def test_a_swarm_without_api_key_is_closed_by_a_key_of_its_own_and_scales(
    need_slurm: None, run_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path, swarm_home: Path
) -> None:
    run_dir = tmp_path / "scratch"
    cfg = stub_config(replicas=1, backend={"run_dir": str(run_dir), "export": ["PATH", "HOME", "PSW_T_NAMED"]})
    config = tmp_path / "swarm.yaml"
    config.write_text(yaml.safe_dump(cfg.redacted()))
    env = {"PSW_T_NAMED": "yes", "PSW_T_UNNAMED": "no"}
    try:
        up = _json(run_cli("up", "-c", str(config), "-o", "json", env=env, timeout=180))
        paths = SwarmPaths.for_swarm(cfg.name, run_dir)
        key_file = paths.api_key_file
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert len(key) >= 32
        lb = up["status"]["url"]
        assert lb and _post(lb) == 401 and _post(lb, "wrong") == 401 and _post(lb, key) == 200
        assert _post(up["status"]["replicas"][0]["url"]) == 401

        # the nodes got the named variables, not the rest of the login environment; HF offline
        status = json.loads(paths.replica_status(0).read_text())
        engine_env = _environ(int(status["pid"]))
        assert engine_env.get("PSW_T_NAMED") == "yes" and "PSW_T_UNNAMED" not in engine_env
        assert engine_env.get("HF_HUB_OFFLINE") == "1" and engine_env.get("TRANSFORMERS_OFFLINE") == "1"
        # the run dir holds the scripts and logs, and is the jobs' working directory
        assert paths.replicas_script.exists() and list(run_dir.rglob("replicas-*.out"))
        jobs = subprocess.run(
            ["squeue", "-h", "-n", f"psw-{cfg.name}-lb,psw-{cfg.name}-replicas", "-o", "%i %Z"],
            capture_output=True,
            text=True,
        ).stdout.split("\n")
        assert len([j for j in jobs if j]) == 2 and all(j.endswith(f" {paths.root}") for j in jobs if j), jobs

        # `scale` is `up --replicas N` on the recorded config: the running replica keeps its job
        first = _task_ids(up)
        two = _json(run_cli("scale", cfg.name, "--replicas", "2", "-o", "json", env=env, timeout=180))
        assert two["status"]["healthy_replicas"] == 2 and _task_ids(two)[0] == first[0], (first, two)
        assert _post(two["status"]["replicas"][1]["url"]) == 401  # the added replica got the key too

        spec = make_job(tmp_path, 200, shards=2)
        job = run_cli("job", "submit", "-n", cfg.name, "--spec", str(spec), timeout=240)
        assert job.returncode == 0, job.stderr[-3000:]
        assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(200)]

        one = _json(run_cli("scale", cfg.name, "--replicas", "1", "-o", "json", timeout=180))
        assert _task_ids(one) == first

        # the key is in no rendered script, log, status file, state row or command output
        needle = key.encode()
        kept = {key_file, paths.lb_auth_conf}  # the LB's key check (nginx map) is the only other place
        assert _files_holding(run_dir, needle, skip=kept) == []
        assert _files_holding(swarm_home, needle, skip=kept) == []
        assert key not in job.stdout + job.stderr + json.dumps(up)
    finally:
        run_cli("down", cfg.name, "-y", timeout=120)


def test_open_endpoint_serves_without_a_key(need_slurm: None, tmp_path: Path) -> None:
    from _slurmkit import LiveSwarm

    swarm = LiveSwarm(stub_config(replicas=1, backend={"open_endpoint": True}))
    try:
        swarm.up()
        assert swarm.handle is not None
        url = swarm.serving.status(swarm.handle).url
        assert url and _post(url) == 200
        assert not swarm.paths.api_key_file.exists()
    finally:
        swarm.down()


def test_shards_in_their_own_allocation_run_exactly_once(need_slurm: None, tmp_path: Path) -> None:
    from _slurmkit import LiveSwarm, job_command

    from prefect_swarm.backends.slurm.compute import SlurmCompute
    from prefect_swarm.interfaces import JobRequest, JobStatus

    swarm = LiveSwarm(stub_config(replicas=1, backend={"jobs": {"cpus": 1, "mem": "200M", "time_limit": "10:00"}}))
    try:
        handle = swarm.up()
        lb = subprocess.run(
            ["squeue", "-h", "-n", swarm.serving.names.lb, "-o", "%i"], capture_output=True, text=True
        ).stdout.strip()
        spec = make_job(tmp_path, 300, shards=2)
        compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
        job = compute.submit(
            JobRequest(name="chat", command=job_command(spec), nshards=2, workdir=str(tmp_path / "job"))
        )
        ids = job.meta["jobs"]
        assert len(ids) == 2 and lb not in ids and all(i.isdigit() for i in ids), (lb, ids)
        assert compute.wait(job) is JobStatus.SUCCEEDED
        # slurmdbd records a job a moment after slurmctld runs it (until then sacct may show nothing,
        # or a half-written record named "allocation"): read it once the shards have ended
        names = ""

        def recorded() -> bool:
            nonlocal names
            names = subprocess.run(
                ["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobName,ReqCPUS,ReqMem"],
                capture_output=True,
                text=True,
            ).stdout
            lines = names.split()
            return len(lines) == 2 and all(
                line.startswith(f"psw-{swarm.cfg.name}.chat-") and "|1|200M" in line for line in lines
            )

        wait_until("both steps in sacct", recorded, timeout_s=30)
        assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(300)]
        assert compute.probe(job).exit_code == 0
        failed = tmp_path / "job" / "failed.jsonl"  # the shards sent the swarm's key: no row got a 401
        assert not failed.exists() or not failed.read_text().strip(), failed.read_text()
    finally:
        swarm.down()


def test_preempted_shards_are_resumable_and_resubmitted_once(
    need_slurm: None, run_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:

    cfg = stub_config(replicas=1, engine={"args": ["--latency-ms", "50"]})
    config = tmp_path / "swarm.yaml"
    config.write_text(yaml.safe_dump(cfg.redacted()))
    try:
        _json(run_cli("up", "-c", str(config), "-o", "json", timeout=180))
        spec = make_job(tmp_path, 1500, concurrency=4, shards=2, drain_seconds=1)
        argv = ["job", "submit", "-n", cfg.name, "--spec", str(spec), "--id", "pre-1", "--resubmit-on-preempt", "1"]
        cli = [sys.executable, "-m", "prefect_swarm.cli.main", *argv]
        proc = subprocess.Popen(
            cli,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        shards = tmp_path / "job" / "shards"
        wait_until(
            "a part file of each shard",
            lambda: len(list(shards.glob("*/part-*.parquet"))),
            until=lambda n: n >= 2,
            timeout_s=60,
        )
        steps = subprocess.run(["squeue", "-h", "-s", "-o", "%i %j"], capture_output=True, text=True).stdout
        ours = [line.split()[0] for line in steps.splitlines() if f"psw-{cfg.name}-pre-1-" in line]
        assert len(ours) == 2, steps
        subprocess.run(["scancel", "--signal=USR1", *ours], check=True)  # what Slurm sends before preempting
        _out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        assert "preempted; resubmitting (1/1)" in err, err[-3000:]
        assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(1500)]
        # `job status` probes only the submission that now stands for the shards (the resubmission)
        status = _json(run_cli("job", "status", "pre-1", "--refresh", "-o", "json"))
        assert [b["status"] for b in status["backend"]] == ["SUCCEEDED"], status["backend"]
        # the first one, probed by its recorded handle, reads resumable, with the command that resumes it
        from prefect_swarm.interfaces import JobHandle, JobStatus
        from prefect_swarm.state import StateStore
        from prefect_swarm.swarm import Swarm

        sub = (StateStore().require_job("pre-1").handle or {})["submissions"][0]
        first = Swarm.from_state(cfg.name).compute.probe(JobHandle.from_dict(sub))
        assert first.status is JobStatus.PREEMPTED and first.exit_code == 75, first
        assert "PREEMPTED (resumable)" in (first.detail or "") and "--id pre-1" in (first.detail or ""), first
    finally:
        run_cli("down", cfg.name, "-y", timeout=120)
