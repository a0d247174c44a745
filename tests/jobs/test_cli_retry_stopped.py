"""`job retry` on a stopped swarm says so before sending anything (exit 4, naming `prefect-swarm up -c`
and `--up`); `--up` brings the swarm up again; a row failing again keeps its earlier reasons.

The stub fails rows (``error_rate``) only while a marker file exists (``fail_while``), so a swarm brought
up again with the same config (the same engine fingerprint) answers them once the test removes it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from _jobkit import make_dataset
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.jobs.checkpoint.ledger import EARLIER_ERRORS
from prefect_swarm.paths import JobPaths
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import stub_swarm_config

N = 150
NAME = "retry-stopped"


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _requests(name: str) -> int:
    swarm = Swarm.from_state(name, StateStore())
    return sum(int(httpx.get(f"{u.removesuffix('/v1')}/stats", timeout=5).json()["requests"]) for u in swarm.endpoints)


def _failed(paths: JobPaths) -> list[dict[str, Any]]:
    return [json.loads(line) for line in paths.failed_rows.read_text().splitlines()]


def test_retry_on_a_stopped_swarm_refuses_then_up_brings_it_back_and_reasons_are_kept(tmp_path: Path) -> None:
    from prefect_swarm.config import SwarmConfig

    make_dataset(tmp_path / "in.parquet", N)
    marker = tmp_path / "failing"
    marker.touch()
    (tmp_path / "base.json").write_text(json.dumps({"max_retries": 0, "concurrency": 8}))
    cfg = SwarmConfig.model_validate(stub_swarm_config(NAME, error_rate=0.4, fail_while=str(marker)))
    with Swarm(cfg):
        res = _cli(
            "job", "submit", "-n", NAME, "--input", str(tmp_path / "in.parquet"), "--output",
            str(tmp_path / "out.parquet"), "--id-column", "id", "--id", "j17", "--spec", str(tmp_path / "base.json"),
        )  # fmt: skip
        assert res.exit_code == 1, res.output
    assert StateStore().require_swarm(NAME).phase == "STOPPED"
    paths = JobPaths(Path(StateStore().require_job("j17").job_dir or ""))
    first = _failed(paths)
    assert 0 < len(first) < N and all("HTTP 50" in r["error"] for r in first), first[:3]

    # the swarm is stopped: refused before anything is sent or written, saying how to bring it up
    parts = sorted(p.name for p in paths.shard(0).parts())
    subs = StateStore().require_job("j17").handle
    res = _cli("job", "retry", "j17")
    assert res.exit_code == 4, res.output
    text = " ".join(res.output.split())
    assert f"swarm '{NAME}' of job j17 is STOPPED: no row was sent" in text, text
    assert "`prefect-swarm up -c " in text and "`prefect-swarm job retry j17 --up`" in text, text
    assert sorted(p.name for p in paths.shard(0).parts()) == parts and StateStore().require_job("j17").handle == subs

    # --up brings it up again; the rows fail again (the marker is still there): each keeps its first reason
    res = _cli("job", "retry", "j17", "--up")
    assert res.exit_code == 1, res.output
    assert "bringing it up again" in res.output and StateStore().require_swarm(NAME).phase == "RUNNING"
    reasons = {r["id"]: r["error"] for r in first}
    second = _failed(paths)
    assert second and {r["id"] for r in second} <= set(reasons)
    for row in second:  # the new reason first, then the one it replaced: never overwritten
        assert row["error"].endswith(EARLIER_ERRORS + reasons[row["id"]]), row

    # with the engine healthy again, the next retry sends only the rows still failed, and the job succeeds
    marker.unlink()
    try:
        sent = _requests(NAME)
        res = _cli("job", "retry", "j17")
        assert res.exit_code == 0, res.output
        assert f"{N} rows: {N} ok, 0 failed" in " ".join(res.output.split())
        # every row that failed the first time is answered now: counted with the reasons it had
        line = next(x for x in res.output.splitlines() if "rows answered on a retry" in x)
        assert line.startswith(f"{len(first)} rows answered on a retry after failing before (earlier reasons: ")
        assert "HTTP 503" in line or "HTTP 500" in line, line
        assert _requests(NAME) - sent == len(second)
    finally:
        assert _cli("down", NAME, "-y").exit_code == 0
    config = re.search(r"`prefect-swarm up -c (\S+)`", text)  # the config the message names is the swarm's
    assert config is not None and Swarm.from_state(NAME, StateStore()).paths.config == Path(config.group(1))
    assert Path(config.group(1)).is_file()
