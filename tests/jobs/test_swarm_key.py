"""Keys travel with the swarm: a job on a keyed swarm finds its key, and a wrong key spends no row.

``up`` of a swarm with ``api_key`` keeps the key in the swarm's folder (``swarm.key``, mode 0600);
``job submit`` from a shell without ``PREFECT_SWARM_API_KEY`` reattaches to the swarm and its jobs
get the key from there. A wrong key (or none, for a job process started by hand) is found by one
request before the rows: exit 2, a message naming the swarm and the key, no completion at the engine.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, requests, run_job, write_spec
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces.jobenv import API_KEY
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import stub_swarm_config

KEY = "sk-swarm-key-3f9a"


@pytest.fixture
def keyed_swarm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Swarm]:
    """A one-replica stub swarm brought up with ``api_key`` in its config; the shell has no key variable."""
    monkeypatch.delenv(API_KEY, raising=False)
    cfg = SwarmConfig.model_validate({**stub_swarm_config("keyed-stub"), "api_key": KEY})
    with Swarm(cfg) as swarm:
        yield swarm


def _completions(swarm: Swarm) -> int:
    resp = httpx.get(swarm.endpoint + "/stats", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    return int(resp.json().get("requests", 0))


def _submit(tmp_path: Path, name: str) -> tuple[int, str]:
    make_dataset(tmp_path / "in.parquet", 30)
    args = [
        "job",
        "submit",
        "-n",
        name,
        "--input",
        str(tmp_path / "in.parquet"),
        "--output",
        str(tmp_path / "o.parquet"),
    ]
    res = CliRunner().invoke(app, [*args, "--id-column", "id"])
    return res.exit_code, res.output + (
        str(res.exception) if res.exception and not isinstance(res.exception, SystemExit) else ""
    )


def test_keyed_swarm_job_from_a_plain_shell_gets_the_key(tmp_path: Path, keyed_swarm: Swarm) -> None:
    key_file = SwarmPaths.of(keyed_swarm.cfg.name, keyed_swarm.cfg.run_dir).api_key_file
    assert key_file.read_text().strip() == KEY and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    unkeyed = httpx.post(keyed_swarm.endpoint + "/v1/chat/completions", json={}, timeout=5)
    assert unkeyed.status_code == 401  # the swarm is closed: a job without the key would get 401s
    code, text = _submit(tmp_path, keyed_swarm.cfg.name)
    assert code == 0, text
    rows = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert len(rows) == 30 and all(r["status"] == "ok" for r in rows), rows[:2]


def test_wrong_key_is_refused_before_any_row(tmp_path: Path, keyed_swarm: Swarm, monkeypatch) -> None:
    monkeypatch.setenv(API_KEY, "sk-not-the-key")
    before = _completions(keyed_swarm)
    code, text = _submit(tmp_path, keyed_swarm.cfg.name)
    assert code == 2, text
    assert "swarm 'keyed-stub' refused the API key (HTTP 401" in text and "nothing was submitted" in text
    assert "sk-not-the-key" not in text and KEY not in text
    assert _completions(keyed_swarm) == before
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_job_process_refuses_a_wrong_or_missing_key_before_any_row(tmp_path: Path, stub_factory, key) -> None:
    """A job process started by hand (no CLI) with a key the swarm refuses: exit 2, the stub counts no request."""
    stub = stub_factory(api_key=KEY)
    make_dataset(tmp_path / "in.parquet", 20)
    spec = write_spec(tmp_path, endpoints=[stub.url])
    before = requests(stub)
    res = run_job(spec, env={API_KEY: key or ""})
    assert res.returncode == 2, res.stderr
    assert f"the swarm at {stub.url} refused the job's request (HTTP 401)" in res.stderr
    assert "No row was sent" in res.stderr
    assert requests(stub) == before
    res = run_job(spec, env={API_KEY: KEY})
    assert res.returncode == 0, res.stderr
    assert requests(stub) - before == 20
