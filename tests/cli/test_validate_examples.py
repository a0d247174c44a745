"""`prefect-swarm validate -c examples/X.yaml` exits 0 and prints the backend's plan for every
shipped example, in text and JSON, with no Lepton token in the environment and no secret shown.
``--offline``: the examples are site configs (partition gpu...), not this machine's Slurm's."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

EXAMPLE_DIR = Path(__file__).parents[2] / "examples"
EXAMPLES = sorted(EXAMPLE_DIR.glob("*.yaml"))

EXPECTED_FILES = {
    "local": ["watchdog-0.json"],
    "slurm": ["replicas.sbatch", "lb.sbatch", "nginx.conf", "watchdog-0.json"],
    "lepton": ["deployment.json", "job-template.json"],
    "external": ["external.json"],
}
SECRET = "sk-example-never-printed-93c1"

RunCli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """An environment without any Lepton variable, with an API key the plan must not show."""
    for name in list(os.environ):
        if name.startswith("LEPTON_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(tmp_path / "home"))
    return {"PREFECT_SWARM_API_KEY": SECRET}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_validate_prints_the_plan_of_every_example(
    path: Path, run_cli: RunCli, no_credentials: dict[str, str], tmp_path: Path
) -> None:
    as_json = run_cli("validate", "--offline", "-c", str(path), "-o", "json", env=no_credentials)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["valid"] is True
    expected = EXPECTED_FILES[doc["backend"]]
    assert set(expected) <= set(doc["plan"]), sorted(doc["plan"])
    assert all(isinstance(text, str) and text for text in doc["plan"].values())
    text = run_cli("validate", "--offline", "-c", str(path), env=no_credentials)
    assert text.returncode == 0, text.stderr
    assert "Traceback" not in text.stderr and "would start" in text.stdout
    for name in expected:
        assert f"--- {name}" in text.stdout
    assert SECRET not in as_json.stdout + as_json.stderr + text.stdout + text.stderr
    assert not (tmp_path / "home" / "swarms").exists(), "validate wrote a swarm folder"


def test_the_slurm_plan_is_the_rendered_scripts(run_cli: RunCli, no_credentials: dict[str, str]) -> None:
    doc = json.loads(
        run_cli("validate", "--offline", "-c", str(EXAMPLE_DIR / "slurm.yaml"), "-o", "json", env=no_credentials).stdout
    )
    assert (
        doc["plan"]["replicas.sbatch"].startswith("#!/bin/bash")
        and "#SBATCH --array=" in doc["plan"]["replicas.sbatch"]
    )
    assert "upstream" in doc["plan"]["nginx.conf"]
    for script, stem in (("replicas.sbatch", "replicas-%A_%a"), ("lb.sbatch", "lb-%j")):
        text = doc["plan"][script]  # a site's tools want stdout and stderr apart
        assert f"/{stem}.out\n" in text and "#SBATCH --error=" in text and f"/{stem}.err\n" in text
    assert doc["warnings"] == []


def test_an_open_slurm_endpoint_is_valid_with_a_warning(
    run_cli: RunCli, no_credentials: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "open.yaml"
    text = (EXAMPLE_DIR / "slurm.yaml").read_text().replace("  type: slurm\n", "  type: slurm\n  open_endpoint: true\n")
    assert "open_endpoint: true" in text
    config.write_text(text)
    env = {k: v for k, v in no_credentials.items() if k != "PREFECT_SWARM_API_KEY"}
    doc = json.loads(run_cli("validate", "--offline", "-c", str(config), "-o", "json", env=env).stdout)
    assert doc["valid"] is True and len(doc["warnings"]) == 1 and "open_endpoint" in doc["warnings"][0]
    shown = run_cli("validate", "--offline", "-c", str(config), env=env)
    assert shown.returncode == 0 and "warning" in shown.stdout and "without an API key" in shown.stdout


def test_the_lepton_plan_masks_the_endpoint_token(
    run_cli: RunCli, no_credentials: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "lepton.yaml"
    text = (EXAMPLE_DIR / "lepton.yaml").read_text().replace("endpoint_token_secret: swarm-endpoint-token", "")
    config.write_text(text)
    doc = json.loads(run_cli("validate", "--offline", "-c", str(config), "-o", "json", env=no_credentials).stdout)
    deployment = json.loads(doc["plan"]["deployment.json"])
    assert deployment["spec"]["api_tokens"] == [{"value": "***"}]
    job = json.loads(doc["plan"]["job-template.json"])
    command = job["spec"]["container"]["command"]  # the setup (the staged wheel's install), then python3
    assert command[:2] == ["sh", "-c"] and ".wheels/" in command[2] and command[4] == "python3"
    secret_refs = [e for e in job["spec"]["envs"] if e["name"] == "PREFECT_SWARM_API_KEY"]
    assert secret_refs and "value" not in secret_refs[0]


def test_validate_says_where_a_slurm_job_runs_its_shards(
    run_cli: RunCli, no_credentials: dict[str, str], tmp_path: Path
) -> None:
    """The LB job hosts lb.cpus x lb.steps_per_cpu shards as steps; a bigger job runs them as jobs of their own."""
    base = (EXAMPLE_DIR / "slurm.yaml").read_text()
    doc = json.loads(
        run_cli("validate", "--offline", "-c", str(EXAMPLE_DIR / "slurm.yaml"), "-o", "json", env=no_credentials).stdout
    )
    cpus = int(doc["config"]["backend"]["lb"]["cpus"])
    slots = cpus * int(doc["config"]["backend"]["lb"]["steps_per_cpu"])
    assert f"up to {slots} shards" in doc["job_shards"] and "sbatch job of its own" in doc["job_shards"]
    import yaml

    data = yaml.safe_load(base)
    data["backend"]["lb"] = {**data["backend"].get("lb", {}), "cpus": 8, "steps_per_cpu": 64}
    config = tmp_path / "big-lb.yaml"
    config.write_text(yaml.safe_dump(data))
    shown = run_cli("validate", "--offline", "-c", str(config), env=no_credentials)
    assert shown.returncode == 0 and "up to 512 shards" in " ".join(shown.stdout.split()), shown.stdout
    assert "--cpus-per-task=8" in json.loads(
        run_cli("validate", "--offline", "-c", str(config), "-o", "json", env=no_credentials).stdout
    )["plan"]["lb.sbatch"]
    data["backend"]["jobs"] = {"cpus": 2, "mem": "4G"}
    config.write_text(yaml.safe_dump(data))
    doc = json.loads(run_cli("validate", "--offline", "-c", str(config), "-o", "json", env=no_credentials).stdout)
    assert doc["job_shards"].startswith("every shard") and "2 CPUs, 4G each" in doc["job_shards"]
