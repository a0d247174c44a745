"""A token-priced cap on an external swarm is never passed: every request reserves its worst-case cost
on the swarm's one account before it is sent, whoever sends it (one job, two jobs at once, a detached
job), and the stop sends nothing queued behind the rate limit.

The issue's case: prices of 100 / 400 $ per 1M prompt / completion tokens, 600 requests a minute,
``max_cost_usd: 0.50``, 400 rows (it spent $0.7895 alone and $1.496 as two jobs). The bill is the
provider's: the tokens the stub engine served, counted at the server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from external_kit import KEY_ENV, cli, dataset, external_config, popen_cli

from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine
from prefect_swarm.testing.waiting import wait_until

KEY = "sk-external-budget-key-5d20"
ENV = {KEY_ENV: KEY}
PRICES = {"input_usd_per_million": 100.0, "output_usd_per_million": 400.0}
CAP, ROWS = 0.5, 400


@pytest.fixture
def stub() -> Any:
    with StubEngine(free_port(), api_key=KEY, model="tiny") as engine:
        yield engine


def _bill(stub: StubEngine, since: dict[str, int] | None = None) -> float:
    """USD of the tokens the provider served since ``since`` (its /stats), at the test's prices."""
    now, since = stub.stats(), since or {}
    pt = now.get("prompt_tokens", 0) - since.get("prompt_tokens", 0)
    ct = now.get("generation_tokens", 0) - since.get("generation_tokens", 0)
    return (PRICES["input_usd_per_million"] * pt + PRICES["output_usd_per_million"] * ct) / 1e6


def _up(tmp_path: Path, stub: StubEngine, cap: float) -> dict[str, int]:
    config = external_config(
        tmp_path, stub.url, requests_per_minute=600, tokens_per_minute=None, cost={**PRICES, "max_cost_usd": cap}
    )
    up = cli("up", "-c", str(config), env=ENV)
    assert up.returncode == 0, up.stdout + up.stderr
    return stub.stats()


def _job(tmp_path: Path, tag: str, *extra: str) -> tuple[str, ...]:
    data, out = tmp_path / f"{tag}.parquet", tmp_path / f"{tag}-out.parquet"
    if not data.exists():
        dataset(data, ROWS)
    args = ("job", "submit", "-n", "ext", "--input", str(data), "--output", str(out), "--id-column", "id")
    return (*args, "--id", f"{tag}-job", *extra)


def test_one_job_stops_within_the_cap_says_the_spend_at_exit_and_a_larger_cap_resumes_it_once(
    tmp_path: Path, stub: StubEngine
) -> None:
    before = _up(tmp_path, stub, CAP)
    res = cli(*_job(tmp_path, "one"), env=ENV)
    said = res.stdout + res.stderr
    assert res.returncode == 1, said
    bill = _bill(stub, before)
    sent = stub.stats()["requests"] - before["requests"]
    print(f"one job: {sent} requests, ${bill:.4f} of ${CAP} at exit")
    assert 0 < bill <= CAP, bill
    assert "budget reached: $" in said and "(max_cost_usd) at exit" in said and "rows left" in said, said
    status = json.loads(cli("job", "status", "one-job", "-o", "json", env=ENV).stdout)
    budget = status["cost"]["budget"]
    assert budget["spent_usd"] >= bill - 1e-6 and budget["spent_usd"] <= CAP, budget  # no answer lost: kept
    assert budget["reserved_usd"] == 0 and budget["rows_left"] == ROWS - status["progress"]["done"] > 0, budget
    assert f"{budget['rows_left']:,} rows left" in said, said
    shown = cli("job", "status", "one-job", env=ENV).stdout
    assert "budget: $" in shown and "rows left" in shown, shown

    again = _up(tmp_path, stub, 100.0)  # a larger cap: brought up again, the same submit resumes
    res = cli(*_job(tmp_path, "one"), env=ENV)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(pq.read_table(tmp_path / "one-out.parquet")) == ROWS
    resent = stub.stats()["requests"] - again["requests"]
    assert sent + resent == ROWS, (sent, resent)  # every row sent once across the stop: none queued was sent
    assert cli("down", "ext", "-y", env=ENV).returncode == 0


def test_two_jobs_at_once_and_a_detached_one_share_one_account(tmp_path: Path, stub: StubEngine) -> None:
    before = _up(tmp_path, stub, CAP)
    first, second = popen_cli(*_job(tmp_path, "a"), env=ENV), popen_cli(*_job(tmp_path, "b"), env=ENV)
    outputs = [p.communicate(timeout=180)[0] for p in (first, second)]
    assert first.returncode == 1 and second.returncode == 1, outputs
    both = _bill(stub, before)
    print(f"two jobs at once: ${both:.4f} of ${CAP} together")
    assert 0 < both <= CAP, both
    assert all("budget reached: $" in o and "at exit" in o for o in outputs), outputs

    # the swarm's account is spent: a third job, detached, sends at most what is left, nobody waiting
    again = _up(tmp_path, stub, CAP)  # brought up again: its account starts afresh
    detached = cli(*_job(tmp_path, "c"), "--detach", env=ENV)
    assert detached.returncode == 0, detached.stderr
    job_id = detached.stdout.strip()
    doc = _wait_until_stopped(job_id)
    bill = _bill(stub, again)
    print(f"detached job: ${bill:.4f} of ${CAP}")
    assert doc["status"] == "PREEMPTED", doc["status"]
    assert 0 < bill <= CAP, bill
    assert doc["cost"]["budget"]["spent_usd"] <= CAP and doc["cost"]["budget"]["stopped"], doc["cost"]
    assert "at exit" in doc["cost"]["budget"]["stopped"]
    assert cli("down", "ext", "-y", env=ENV).returncode == 0


def _wait_until_stopped(job_id: str, timeout_s: float = 120) -> dict[str, Any]:
    return wait_until(
        f"job {job_id} to stop",
        lambda: json.loads(cli("job", "status", job_id, "--refresh", "-o", "json", env=ENV).stdout),
        until=lambda doc: doc["status"] not in ("RUNNING", "PENDING"),
        timeout_s=timeout_s,
        poll_s=1,
    )
