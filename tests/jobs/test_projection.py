"""The cost and time preview: one projection rule (config.cost.projection), shown by `job status`, the
CLI's wait and `validate --estimate` (a pilot of K rows on a running local stub swarm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
import yaml
from _jobkit import make_dataset
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.config import SwarmConfig
from prefect_swarm.config.cost import CostConfig, duration, job_projection, projection, projection_text
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until

PRICED = CostConfig(gpu_hour_usd=2.5)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _completions(swarm: Swarm) -> int:
    return sum(
        int(httpx.get(u.removesuffix("/v1").rstrip("/") + "/stats", timeout=5).json().get("requests", 0))
        for u in swarm.endpoints
    )


# ------------------------------------------------------------------------------------ the rule
def test_projection_of_known_inputs() -> None:
    p = projection(done=1_000, total=10_000, rate_rows_s=100.0, elapsed_s=10.0, gpus=8, cost=PRICED)
    assert p["ready"] and p["rows_left"] == 9_000
    assert p["remaining_s"] == 90.0 and p["wall_s"] == 100.0  # 9,000 rows / 100 rows/s, plus the 10 s run
    assert p["gpu_hours"] == pytest.approx(8 * 100 / 3600, abs=1e-6)
    assert p["gpu_hours_left"] == pytest.approx(8 * 90 / 3600, abs=1e-6)
    assert p["usd"] == pytest.approx(8 * 100 / 3600 * 2.5, abs=1e-4)
    assert p["usd_left"] == pytest.approx(0.5, abs=1e-4)
    text = projection_text(p)
    assert text == (
        "projection: 1,000/10,000 rows at 100.0 rows/s: 1m30s left, 1m40s for the whole input; "
        "0.2222 GPU-hours (8 GPUs), $0.556 at $2.5/GPU-hour ($0.5 of it still to spend)"
    )


def test_projection_per_shape_price_and_a_billion_rows() -> None:
    cost = CostConfig(gpu_hour_usd=1.0, per_shape={"gpu.h100-sxm": 3.0})
    p = projection(
        done=0,
        total=10**9,
        rate_rows_s=16_000.0,
        elapsed_s=0.0,
        gpus=64,
        cost=cost,
        shape="gpu.h100-sxm",
        min_elapsed_s=0,
    )
    hours = 10**9 / 16_000 / 3600  # 62,500 s: 17 h 21 min of wall time
    assert p["wall_s"] == pytest.approx(hours * 3600, abs=0.1)
    assert p["gpu_hours"] == pytest.approx(64 * hours, rel=1e-6)
    assert p["usd"] == pytest.approx(64 * hours * 3.0, rel=1e-4)
    assert "17h21m for the whole input" in str(projection_text(p))
    assert str(projection_text(p)).endswith(
        "1111 GPU-hours (64 GPUs), $3,333 at $3/GPU-hour ($3,333 of it still to spend)"
    )


def test_projection_without_a_price_says_how_to_set_one() -> None:
    p = projection(done=50, total=150, rate_rows_s=10.0, elapsed_s=6.0, gpus=2, cost=CostConfig())
    assert p["ready"] and p["remaining_s"] == 10.0 and p["wall_s"] == 16.0
    assert p["gpu_hours"] == pytest.approx(2 * 16 / 3600, abs=1e-6)
    assert p["usd"] is None and p["usd_left"] is None and p["price"] == "no price: set backend.cost.gpu_hour_usd"
    assert str(projection_text(p)).endswith("0.008889 GPU-hours (2 GPUs) (no price: set backend.cost.gpu_hour_usd)")
    cpu = projection(done=50, total=150, rate_rows_s=10.0, elapsed_s=6.0, gpus=0, cost=PRICED)
    assert cpu["gpu_hours"] == 0 and "no GPUs in the swarm config" in str(projection_text(cpu))


def test_no_projection_before_a_short_while_or_without_rows() -> None:
    early = projection(done=10, total=100, rate_rows_s=5.0, elapsed_s=2.0, gpus=8, cost=PRICED)
    idle = projection(done=0, total=100, rate_rows_s=0.0, elapsed_s=60.0, gpus=8, cost=PRICED)
    for p in (early, idle):
        assert not p["ready"] and p["wall_s"] is None and p["usd"] is None
        assert projection_text(p) == "projection: measuring: projected after 5s of running with rows answered"
    assert [duration(s) for s in (None, 45, 395, 11_520, 187_200)] == ["?", "45s", "6m35s", "3h12m", "2d04h"]


def test_the_progress_bar_shows_the_same_projection_short() -> None:
    from prefect_swarm.cli.job import _bar_projection

    p = projection(done=1_000, total=10_000, rate_rows_s=100.0, elapsed_s=10.0, gpus=8, cost=PRICED)
    assert _bar_projection(p) == "whole input ~1m40s, 0.2222 GPU-h, $0.556"
    unpriced = projection(done=1_000, total=10_000, rate_rows_s=100.0, elapsed_s=10.0, gpus=8, cost=CostConfig())
    assert _bar_projection(unpriced) == "whole input ~1m40s, 0.2222 GPU-h"
    assert _bar_projection(None) == "" and _bar_projection({**p, "ready": False}) == ""


def test_job_projection_reads_progress_and_the_recorded_swarm_config() -> None:
    t0 = 1_000_000.0
    progress = {
        "done": 300,
        "total": 1_000,
        "rate_rows_s": 20.0,  # the running shards' sum, as of their last progress writes
        "shards": [
            {"state": "running", "started_at": t0, "updated_at": t0 + 10},
            {"state": "running", "started_at": t0 + 2, "updated_at": t0 + 9},
            {"state": "done", "started_at": t0 - 100, "updated_at": t0 + 50},  # an ended shard dates nothing
        ],
    }
    swarm = {"replicas": 4, "gpus_per_replica": 2, "backend": {"cost": {"gpu_hour_usd": 3.0}}}
    p = job_projection(progress, swarm)
    assert p["elapsed_s"] == 10 and p["remaining_s"] == 35.0 and p["wall_s"] == 45.0 and p["gpus"] == 8
    assert p["usd"] == pytest.approx(8 * 45 / 3600 * 3.0, abs=1e-4)
    assert job_projection(progress, swarm) == p  # as of the checkpoints: the same until the next one
    ended = job_projection({**progress, "shards": progress["shards"][2:]}, swarm)
    assert not ended["ready"]
    assert not job_projection({**progress, "shards": [{"state": "running", "started_at": t0}]}, swarm)["ready"]


def test_a_running_projection_counts_the_requests_in_flight() -> None:
    """A shard keeps 200 requests in flight, answered 2 s after they are sent, at 100 rows/s: at 10 s it
    has answered 800 rows. The rows alone say 80 rows/s (the 2 s before the first answer counted); the
    rows and those in flight say 100, and the projection of 6,000 rows is the job's 62 s."""
    t0 = 1_000_000.0
    shard = {"state": "running", "started_at": t0, "updated_at": t0 + 10, "rows_this_run": 800, "in_flight": 200}
    progress = {"done": 800, "total": 6_000, "rate_rows_s": 80.0, "shards": [shard]}
    p = job_projection(progress, None)
    assert p["rate_rows_s"] == 100 and p["wall_s"] == pytest.approx(62, abs=0.1)
    older = {k: v for k, v in shard.items() if k != "in_flight"}  # a progress file without it: as before
    assert job_projection({**progress, "shards": [older]}, None)["rate_rows_s"] == 80


def test_a_running_projection_adds_the_tail_of_the_longest_answers() -> None:
    """Answers of 43 tokens on average take 1.3 s; the longest seen has 256 tokens (a long tail of
    lengths): the last rows in flight end with it, 1.3 x (256 / 43 - 1) = 6.4 s after the rate says;
    the projection adds it while rows are left. Even lengths add nothing."""
    t0 = 1_000_000.0
    shard = {"state": "running", "started_at": t0, "updated_at": t0 + 10, "rows_this_run": 800, "in_flight": 200}
    bare = {"done": 800, "total": 6_000, "rate_rows_s": 80.0, "shards": [shard]}
    answers = {"latency_mean_s": 1.3, "tokens_mean": 43.0, "tokens_longest": 256}
    tailed = {**bare, "shards": [{**shard, "answers": answers}]}
    even = {**bare, "shards": [{**shard, "answers": {**answers, "tokens_mean": 32.0, "tokens_longest": 32}}]}
    base = job_projection(bare, None)["wall_s"]
    assert job_projection(tailed, None)["wall_s"] == pytest.approx(base + 1.3 * (256 / 43 - 1), abs=0.1)
    assert job_projection(even, None)["wall_s"] == base
    assert job_projection(tailed, None)["rate_rows_s"] == 100  # the rate shown is the rate
    assert projection(done=10, total=10, rate_rows_s=5, elapsed_s=9, gpus=0, cost=CostConfig(), tail_s=7)["wall_s"] == 9


def test_pilot_input_is_the_first_k_rows_of_the_same_kind(tmp_path: Path) -> None:
    from prefect_swarm.jobs.rows.input import InputDataset
    from prefect_swarm.pilot import pilot_input

    make_dataset(tmp_path / "in.parquet", 2_500, row_group=1000)
    out = tmp_path / "p"
    out.mkdir()
    first = pilot_input(InputDataset(tmp_path / "in.parquet"), 1_200, out)  # crosses a row group
    assert pq.read_table(first).column("id").to_pylist() == [f"r{i:06d}" for i in range(1_200)]
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "n": i}}
        for i in range(40)
    ]
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps(x) + "\n" + ("\n" if i == 3 else "") for i, x in enumerate(lines))
    )
    copied = pilot_input(InputDataset(tmp_path / "in.jsonl"), 10, out)
    assert copied.name.endswith(".jsonl") and [json.loads(x) for x in copied.read_text().splitlines()] == lines[:10]


# ------------------------------------------------------------------------------------ CLI on a stub swarm
def test_job_status_and_wait_show_the_projection(tmp_path: Path) -> None:
    make_dataset(tmp_path / "in.parquet", 480)
    spec = tmp_path / "base.json"
    spec.write_text(json.dumps({"checkpoint_every": 20, "concurrency": 4}))
    cfg = stub_swarm_config("proj", latency_ms=60)
    with Swarm(SwarmConfig.model_validate(cfg)):
        args = ["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out.parquet")]
        res = _cli("job", "submit", "-n", "proj", *args, "--id-column", "id", "--spec", str(spec), "--detach")
        assert res.exit_code == 0, res.output
        job_id = res.stdout.strip().splitlines()[-1]
        doc = wait_until(
            "a ready projection (or the job's end)",
            lambda: json.loads(_cli("job", "status", job_id, "-o", "json").stdout),
            until=lambda doc: doc["status"] != "RUNNING" or (doc.get("projection") or {}).get("ready"),
            timeout_s=60,
            poll_s=0.5,
        )
        p = doc["projection"]
        assert doc["status"] == "RUNNING" and p["ready"], doc
        # ~4 in flight x 1/0.06 s: the rate is the shards' own, and the rest follows from it
        assert 5 < p["rate_rows_s"] < 80 and p["rows_total"] == 480
        assert p["remaining_s"] == pytest.approx(p["rows_left"] / p["rate_rows_s"], rel=0.01, abs=0.2)
        assert p["gpus"] == 0 and p["usd"] is None
        table = _cli("job", "status", job_id)
        assert "projection: " in table.stdout and "rows/s:" in table.stdout and "for the whole input" in table.stdout

        waited = CliRunner().invoke(app, ["job", "wait", job_id])
        assert waited.exit_code == 0, waited.output
        assert f"job {job_id}: projection: " in waited.stderr and "for the whole input" in waited.stderr
        done = json.loads(_cli("job", "status", job_id, "-o", "json").stdout)
        assert done["status"] == "SUCCEEDED" and done["projection"] is None


def _config_file(tmp_path: Path, **over: Any) -> tuple[Path, dict[str, Any]]:
    data = stub_swarm_config("pilot", replicas=1, latency_ms=20)
    data.update(over)
    path = tmp_path / "pilot.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


def test_validate_estimate_needs_the_swarm_up(tmp_path: Path) -> None:
    make_dataset(tmp_path / "in.parquet", 50)
    path, _ = _config_file(tmp_path)
    res = _cli("validate", "-c", str(path), "--estimate", "10", "--input", str(tmp_path / "in.parquet"))
    assert res.exit_code == 2, res.output
    assert "it is not up" in res.output and f"prefect-swarm up -c {path}" in res.output
    res = _cli("validate", "-c", str(path), "--estimate", "10")
    assert res.exit_code == 2 and "--input" in res.output


def test_validate_estimate_sends_k_requests_writes_no_output_and_projects(tmp_path: Path) -> None:
    n, k = 20_000, 120
    make_dataset(tmp_path / "in.parquet", n)
    path, data = _config_file(tmp_path)
    with Swarm(SwarmConfig.model_validate(data)) as swarm:
        before = _completions(swarm)
        args = [
            "--input",
            str(tmp_path / "in.parquet"),
            "--id-column",
            "id",
            "--job-kwargs",
            '{"sampling": {"max_tokens": 4}}',
        ]
        res = _cli("validate", "-c", str(path), "--estimate", str(k), *args, "--replicas", "4", "-o", "json")
        assert res.exit_code == 0, res.output
        assert _completions(swarm) - before == k  # exactly the pilot's rows, nothing else
        est = json.loads(res.stdout)["estimate"]
        assert est["pilot_rows"] == k and est["pilot_failed"] == 0 and est["pilot_requests"] == k
        assert est["measured_replicas"] == 1 and est["projected_replicas"] == 4
        assert est["rows_s_per_replica"] == est["steady_rate_rows_s"] and est["tokens_per_row"] > 0
        assert est["steady_rate_rows_s"] >= est["pilot_rate_rows_s"] > 0  # the ramp and tail left out
        assert 0 < est["start_and_tail_s"] < est["pilot_seconds"] + 5
        p = est["projection"]
        assert p["ready"] and p["rows_total"] == n and p["rows_done"] == 0
        assert p["rate_rows_s"] == pytest.approx(est["steady_rate_rows_s"] * 4, rel=0.01)  # 4 replicas / 1
        # the start and tail once, then every row at the steady rate
        assert p["wall_s"] == pytest.approx(est["start_and_tail_s"] + n / p["rate_rows_s"], abs=0.2)
        assert any("projected for 4" in note for note in est["notes"])
        assert any("is under" in note for note in est["notes"])  # 120 rows cannot fill 256 + 16 in flight
        assert est["pilot_rows_needed"] >= 3 * 272 and est["longest_answer_s"] > 0

        # said up front, before the pilot runs (stderr: the JSON on stdout stays whole): the pilot it needs
        assert "a projection within 10 % needs at least 816 (3x the 272 requests" in res.stderr
        assert res.stderr.index("needs at least") < res.stderr.index("--estimate 816 or more") < len(res.stderr)

        table = _cli("validate", "-c", str(path), "--estimate", "30", *args)
        assert table.exit_code == 0, table.output
        assert (
            "pilot: 30 rows (0 failed)" in table.stdout
            and "for 1 replica(s), projection: 0/20,000 rows" in table.stdout
        )
    assert StateStore().list_jobs() == []  # no job record
    assert not (tmp_path / "out.parquet").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "in.parquet",
        "pilot.yaml",
    ]


def test_the_pilot_measures_its_steady_rate_apart_from_its_start_and_tail() -> None:
    """Two shards whose answers come in whole batches (a staircase: 128 rows a second each, after 3 s of
    start and first answers, the last batch 4 s late: a long answer): the steady rate is 256 rows/s,
    the rest is start and tail, and the projection of 100,000 rows is both once plus the rows at that rate."""
    from prefect_swarm.pilot import estimate, steady_rate, timeline

    t0, rows = 1000.0, 2560
    writes: dict[int, list[Any]] = {i: [(t0 + 3 + s + 0.01 * i, 128 * (s + 1), None) for s in range(9)] for i in (0, 1)}
    for i in (0, 1):
        writes[i].append((t0 + 3 + 8 + 4 + 0.01 * i, 1280, None))
    line = timeline(writes)
    assert line[-1] == (t0 + 15.01, rows, None) and len(line) == 20
    assert steady_rate(line, rows) == pytest.approx(256, rel=0.01)
    shards = [{"started_at": t0 + 0.5, "updated_at": writes[i][-1][0], "requests": 1280} for i in (0, 1)]
    progress = {"shards": shards, "done": rows, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0}
    cfg = SwarmConfig.model_validate(stub_swarm_config("p", replicas=1))
    est = estimate(progress, 100_000, cfg, cfg, 2, line, launched_at=t0, latencies_s=[1.0] * 2000 + [8.0] * 100)
    assert est["steady_rate_rows_s"] == pytest.approx(256, rel=0.01)
    assert est["start_and_tail_s"] == pytest.approx(15.01 - rows / 256, rel=0.02)
    assert est["projection"]["wall_s"] == pytest.approx(est["start_and_tail_s"] + 100_000 / 256, rel=0.01)
    assert est["pilot_rate_rows_s"] < 200  # the whole pilot's rate would have projected 30 % long
    # the pilot it needs: 3 x its longest answer (8 s) at 256 rows/s, more than 3 x the 272 in flight
    assert est["pilot_rows_needed"] == 3 * 256 * 8 and any("--estimate 6144" in n for n in est["notes"])


def test_a_burst_of_checkpoints_counts_once() -> None:
    """Whole batches answered at once (256 rows every second, the pilot checkpointing every 25 rows): the
    checkpoints of one burst come within milliseconds, at 25, 50, ... 256 rows; the rate is measured
    from the end of one burst to the end of another: 256 rows/s, not what the first write past 20 %
    and the first past 80 % would say (a burst's first checkpoint dates its rows too early)."""
    from prefect_swarm.pilot import steady_rate, timeline

    writes = [
        (1000.0 + b + 0.002 * j, min(256 * b + 25 * (j + 1), 256 * (b + 1)), None) for b in range(4) for j in range(11)
    ]
    line = timeline({0: writes})
    assert steady_rate(line, 1024) == pytest.approx(256, rel=0.01)


def test_the_steady_rate_by_littles_law() -> None:
    """With the shards' requests in flight and the answers' latencies: in flight over the mean latency,
    whenever the checkpoints were written (late writes of a burst, a writer thread lagging) and
    whatever the lengths (5 % of the answers 8 x as long): 272 in flight, 1.35 s on average: 201 rows/s."""
    from prefect_swarm.pilot import steady_rate, timeline

    late = [(1000.0 + 0.5 * n + (0.3 if n % 3 else 0), 100 * n, 272) for n in range(1, 11)]
    lengths = [1.0] * 95 + [8.0] * 5
    assert steady_rate(timeline({0: late}), 1000, lengths) == pytest.approx(272 / 1.35, rel=0.001)
    assert steady_rate(timeline({0: late, 1: [(1001.0, 50, None)]}), 1050, lengths) is not None  # the slope
