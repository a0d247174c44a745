"""Site rules of a Slurm swarm: its files stay in its run dir, a failed `up` blocks nothing and
`validate` asks Slurm, a failing `setup` line stops the job with its reason, and a job's relative
paths mean the submitting shell's folder (with each failed shard's reason and log printed).

The setup guard is checked with bash alone; the rest on the real single-node Slurm, every command
run as its own process (the CLI), as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from _slurmkit import make_job, stub_config

from prefect_swarm.backends.slurm import render
from prefect_swarm.paths import SwarmPaths, read_json

SETUP = ["echo setting up", "false || true", "nosuch-site-module load cuda/12 2>/dev/null", "touch reached"]


def _rendered(tmp_path: Path, setup: list[str]) -> SwarmPaths:
    """The replica and LB scripts of a one-replica swarm with ``setup``, written under ``tmp_path``."""
    cfg = stub_config(replicas=1, backend={"setup": setup, "run_dir": str(tmp_path / "run")})
    paths = render.swarm_paths(cfg).ensure()
    for path, text in render.render_files(cfg, paths).items():
        path.write_text(text)
    return paths


def _bash(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": "0", "HOME": str(cwd)}
    return subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_the_first_failing_setup_line_stops_the_replica_task(tmp_path: Path) -> None:
    paths = _rendered(tmp_path, SETUP)
    run = _bash(paths.replicas_script, tmp_path)
    assert run.returncode == 1, run.stderr
    why = "setup line 3 failed (exit 127): nosuch-site-module load cuda/12 2>/dev/null"
    assert why in run.stderr and "setting up" in run.stdout
    assert not (tmp_path / "reached").exists()  # nothing after the failing line ran
    status = read_json(paths.replica_status(0))
    assert status["failed"] is True and status["detail"] == why  # `up` reports it; nothing resubmits


def test_the_first_failing_setup_line_stops_the_lb_job(tmp_path: Path) -> None:
    paths = _rendered(tmp_path, SETUP)
    run = _bash(paths.lb_script, tmp_path)
    assert run.returncode == 1
    assert "prefect-swarm LB: setup line 3 failed (exit 127): nosuch-site-module" in run.stderr
    assert not (tmp_path / "reached").exists()


def test_a_setup_that_succeeds_goes_on(tmp_path: Path) -> None:
    paths = _rendered(tmp_path, ["echo setting up", "false || true", "touch reached"])
    run = _bash(paths.replicas_script, tmp_path)  # outside Slurm it stops at the next line that needs Slurm
    assert (tmp_path / "reached").exists()
    assert "setup line" not in run.stderr and "this script runs under Slurm" in run.stderr
    assert not paths.replica_status(0).exists()


# ---------------------------------------------------------------------------------- on Slurm
def _cli(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "prefect_swarm.cli.main", *args]
    full = {**os.environ, "COLUMNS": "250", **env}
    return subprocess.run(argv, capture_output=True, text=True, env=full, cwd=cwd, timeout=timeout)


def _write(path: Path, cfg_data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg_data))
    return path


def _down(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`prefect-swarm down NAME -y`; whatever happens, no job of the swarm is left (scancel by its names)."""
    try:
        return _cli("down", name, "-y", env=env, timeout=180)
    finally:
        subprocess.run(["scancel", "-n", f"psw-{name}-replicas,psw-{name}-lb"], capture_output=True, check=False)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


@pytest.mark.slurm
def test_a_failed_up_with_a_bad_partition_blocks_nothing(need_slurm: None, tmp_path: Path) -> None:
    """`up` with a partition Slurm lacks fails naming it; `validate` names it too (Slurm is asked);
    the fixed config's `up` starts at once."""
    cfg = stub_config(replicas=1, backend={"run_dir": str(tmp_path / "run"), "queue_timeout_s": 600})
    good = cfg.redacted()
    bad = {**good, "backend": {**good["backend"], "partition": "no-such-part"}}
    env: dict[str, str] = {}
    try:
        failed = _cli("up", "-c", str(_write(tmp_path / "bad.yaml", bad)), env=env)
        assert failed.returncode == 2 and "no-such-part" in failed.stderr, failed.stderr
        assert "Traceback" not in failed.stderr
        checked = _cli("validate", "-c", str(tmp_path / "bad.yaml"), env=env)
        assert checked.returncode == 2 and "no-such-part" in checked.stderr and "backend.partition" in checked.stderr
        assert "Traceback" not in checked.stderr
        started = time.monotonic()
        submitted = _cli("up", "-c", str(_write(tmp_path / "good.yaml", good)), "--no-wait", "-o", "json", env=env)
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        assert time.monotonic() - started < 30  # submitted at once: no wait on the failed bring-up
        assert json.loads(submitted.stdout)["swarm"]["phase"] == "INITIALIZING"
        up = _cli("up", "-c", str(tmp_path / "good.yaml"), "-o", "json", env=env, timeout=700)
        assert up.returncode == 0, up.stderr[-3000:]
        assert json.loads(up.stdout)["swarm"]["phase"] == "RUNNING"
    finally:
        _down(cfg.name, env)


@pytest.mark.slurm
def test_a_failing_setup_line_fails_up_with_its_reason(need_slurm: None, tmp_path: Path) -> None:
    setup = ["module load nosuch/1.0"]
    cfg = stub_config(replicas=1, backend={"run_dir": str(tmp_path / "run"), "setup": setup, "queue_timeout_s": 600})
    env: dict[str, str] = {}
    try:
        up = _cli("up", "-c", str(_write(tmp_path / "s.yaml", cfg.redacted())), env=env, timeout=700)
        assert up.returncode == 4, up.stderr[-3000:]
        # the reason heads the error (whichever job, LB or replica task, left the queue first)
        message = up.stderr.split("stderr:", 1)[0]
        assert "setup line 1 failed (exit 127): module load nosuch/1.0" in message, up.stderr[-3000:]
        assert "Traceback" not in up.stderr
    finally:
        _down(cfg.name, env)


NODE_ONLY = '''
import os
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.builtin import ChatCompletionJob


class NodeOnly(ChatCompletionJob):
    """Runs on the submit host, refuses inside a Slurm job: a job whose environment differs there."""

    def __init__(self, **kwargs):
        if os.environ.get("SLURM_JOB_ID"):
            raise ConfigError("NodeOnly refuses to run inside Slurm job " + os.environ["SLURM_JOB_ID"])
        super().__init__(**kwargs)
'''


@pytest.mark.slurm
@pytest.mark.slow
def test_no_file_of_a_slurm_job_outside_its_run_dir(need_slurm: None, tmp_path: Path) -> None:
    """HOME and PREFECT_SWARM_HOME listed before and after `up`, two jobs (one in backend.jobs mode with
    a relative --input from the submitting shell's folder) and `down`: the only new files there are the
    state database's; the jobs' spec, ledgers, parts and manifest are in the run dir."""
    home = tmp_path / "home"
    swarm_home = home / ".prefect-swarm"
    run_dir, work, mods = tmp_path / "scratch", tmp_path / "work", tmp_path / "mods"
    for d in (home, work, mods):
        d.mkdir()
    (home / ".bashrc").write_text("# a user's own file\n")
    (mods / "nodeonly.py").write_text(NODE_ONLY)
    env = {"HOME": str(home), "PREFECT_SWARM_HOME": str(swarm_home), "PYTHONPATH": str(mods)}
    cfg = stub_config(
        replicas=1,
        backend={
            "run_dir": str(run_dir),
            "jobs": {"cpus": 1},
            "export": ["PATH", "HOME", "PYTHONPATH"],
            "queue_timeout_s": 600,
        },
    )
    config = _write(tmp_path / "swarm.yaml", cfg.redacted())
    make_job(work, 60)  # work/in.parquet
    before = _files(home)
    try:
        up = _cli("up", "-c", str(config), env=env)
        assert up.returncode == 0, up.stderr[-3000:]
        # relative paths: the submitting shell's folder, though each shard job runs in the job folder
        ok = _cli(
            "job",
            "submit",
            "-n",
            cfg.name,
            "--input",
            "in.parquet",
            "--output",
            "out/result.parquet",
            "--shards",
            "2",
            env=env,
            cwd=work,
            timeout=600,  # shard jobs may queue behind others on a shared cluster
        )
        assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
        assert (work / "out" / "result.parquet").exists()

        bad = _cli(
            "job",
            "submit",
            "-n",
            cfg.name,
            "--input",
            "in.parquet",
            "--output",
            "out/bad.parquet",
            "--shards",
            "2",
            "--job",
            "nodeonly:NodeOnly",
            env=env,
            cwd=work,
            timeout=600,  # shard jobs may queue behind others on a shared cluster
        )
        assert bad.returncode == 1
        jobs_root = SwarmPaths.for_swarm(cfg.name, run_dir).root / "jobs"
        for shard in (0, 1):  # each failed shard: how it ended, its log, the log's last lines
            line = next(x for x in bad.stdout.splitlines() if x.startswith(f"shard {shard} "))
            assert "FAILED" in line and "(exit 2): it refused its input" in line, bad.stdout
            log = Path(line.split("; log: ", 1)[1])
            assert log.is_relative_to(run_dir) and log.exists(), bad.stdout  # the step's own log
        assert bad.stdout.count("NodeOnly refuses to run inside Slurm job") >= 2, bad.stdout
    finally:
        down = _down(cfg.name, env)
    assert down.returncode == 0, down.stderr[-2000:]
    new = _files(home) - before
    state_db = {str((swarm_home / "state.db").relative_to(home)) + s for s in ("", "-wal", "-shm", "-journal")}
    assert new <= state_db, f"files of the swarm or its jobs outside its run dir: {sorted(new - state_db)}"
    job_files = _files(jobs_root)
    for name in ("spec.json", "manifest.json", "shards/00000/DONE", "shards/00001/progress.json"):
        assert any(f.endswith(name) for f in job_files), (name, sorted(job_files)[:40])
