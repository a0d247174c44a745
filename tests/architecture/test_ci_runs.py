"""``scripts/ci_runs.py`` (CONTRIBUTING: a commit's flake rate and time) on a fresh clone of this
checkout, with a stand-in for ``.ci/run`` that prints what pytest and ``.ci/run`` print and uses a
process that spends a second and a half of CPU: the row it prints and the summary it writes say what
the run did, its CPU included."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ci_runs.py"
STAND_IN = (
    "python3 -c 'import time\nwhile time.process_time() < 1.5: pass'; "
    "echo '2 failed, 5 passed, 1 warning in 12.50s (0:00:12)'; echo '[ci] total 14 s'; exit 2"
)


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_a_run_on_a_fresh_clone_reports_what_it_ran(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1", "--out", str(tmp_path), "--command", STAND_IN],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stdout + out.stderr  # a failed run fails the script
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
    row = out.stdout.splitlines()[2]
    assert row.startswith(f"| 1 | {head.stdout.strip()} | 2 | 2 failed, 5 passed, 1 warning | 12.5 | 14 |"), row
    assert "0 of 1 runs passed" in out.stdout
    summary = json.loads((tmp_path / "run-1" / "summary.json").read_text())
    assert summary["rc"] == 2 and summary["cpu_user_s"] + summary["cpu_system_s"] >= 1, summary
    # the sampler saw the stand-in work (among every process of the machine: a busy one has larger kinds)
    procs = json.loads((tmp_path / "run-1" / "processes.json").read_text())
    assert sum(p["cpu_s"] for p in procs if "process_time() < 1.5" in p["cmd"]) >= 0.5, procs
    assert "2 failed, 5 passed" in (tmp_path / "run-1" / "ci.log").read_text()
    assert not (tmp_path / "run-1" / "repo").exists()  # the clone is removed after its run


def test_a_command_run_as_a_module_and_as_its_script_is_one_kind() -> None:
    spec = importlib.util.spec_from_file_location("ci_runs", SCRIPT)
    assert spec and spec.loader
    ci_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ci_runs)
    as_script = ci_runs.kind("/repo/.venv/bin/python /repo/.venv/bin/prefect-swarm up -c swarm.yaml")
    as_module = ci_runs.kind("/repo/.venv/bin/python -m prefect_swarm.cli.main up -c swarm.yaml")
    assert as_script == as_module == "prefect-swarm"
    assert ci_runs.kind("/repo/.venv/bin/python -m prefect_swarm.jobs.run --spec s.json") == "prefect_swarm.jobs.run"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize(
    ("flag", "value", "says"), [("--ref", "no-such-ref", "not a commit"), ("--runs", "0", "1 or more")]
)
def test_a_wrong_ref_or_count_is_refused_before_any_clone(tmp_path: Path, flag: str, value: str, says: str) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), flag, value, "--out", str(tmp_path), "--command", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and says in out.stderr and flag in out.stderr, out.stderr
    assert not list(tmp_path.iterdir())  # nothing cloned
