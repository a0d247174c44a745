"""`prefect-swarm sleep` / `wake` on a local swarm of GPU-like simulators with sleep mode: a sleeping
replica leaves the job endpoints and targets.json and keeps running; a job across a sleep and a wake
loses no row; `validate` refuses sleep mode where the engine or the backend cannot."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.gpu_sim import GARBLED, MODULE
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

SLEEPY = {
    "kind": "command",
    "command": engine_command(module=MODULE, enable_sleep_mode=True, step_ms=5, sleep_s=0.1, wake_s=0.3),
    "startup_timeout_s": 60,
    "sleep_mode": True,
}


def _json(result: Any) -> Any:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _targets(name: str) -> list[str]:
    return [t for group in json.loads(SwarmPaths.for_swarm(name).metrics_targets.read_text()) for t in group["targets"]]


@pytest.mark.slow
@pytest.mark.usefixtures("local_backend")
def test_a_job_across_a_sleep_and_a_wake_loses_nothing(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path], swarm_home: Path, tmp_path: Path
) -> None:
    config = stub_swarm_config("sleepy", replicas=2, engine=SLEEPY)
    up = _json(run_cli("up", "-c", str(config), "-o", "json", timeout=120))
    urls = [r["url"] for r in up["status"]["replicas"]]
    n = 4000
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "prompt": [f"q {i}" for i in range(n)]}),
                   tmp_path / "in.parquet")  # fmt: skip
    argv = ["job", "submit", "-n", "sleepy", "--input", str(tmp_path / "in.parquet"), "--id", "sl-1"]
    argv += ["--output", str(tmp_path / "out.parquet"), "--shards", "2", "--concurrency", "4", "--detach"]
    submitted = run_cli(*argv, timeout=120)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    done = lambda: int(_json(run_cli("job", "status", "sl-1", "-o", "json"))["progress"].get("done", 0))  # noqa: E731
    wait_until("rows answered", done, timeout_s=120)

    slept = _json(run_cli("sleep", "sleepy", "--replica", "1", "-o", "json", timeout=120))
    assert [(r["replica"], r["asleep"], r["level"]) for r in slept["replicas"]] == [(1, True, 1)]
    assert httpx.get(urls[1] + "/is_sleeping").json() == {"is_sleeping": True}
    assert urls[1].split("://")[1] not in _targets("sleepy") and urls[0].split("://")[1] in _targets("sleepy")
    assert httpx.get(urls[1] + "/health").status_code == 200  # still running: the allocation is kept
    status = _json(run_cli("status", "sleepy", "-o", "json"))
    assert "asleep" in status["status"]["replicas"][1]["detail"], status
    assert status["status"]["replicas"][1]["external_id"] == up["status"]["replicas"][1]["external_id"]  # same pid
    done_asleep = done()
    wait_until("rows answered while replica 1 sleeps", done, until=lambda d: d > done_asleep, timeout_s=120)

    woke = _json(run_cli("wake", "sleepy", "--replica", "1", "-o", "json", timeout=120))
    assert [(r["replica"], r["asleep"]) for r in woke["replicas"]] == [(1, False)]
    assert woke["replicas"][0]["seconds"] >= 0.3  # the simulator's level-1 wake time
    assert urls[1].split("://")[1] in _targets("sleepy")
    assert httpx.get(urls[1] + "/is_sleeping").json() == {"is_sleeping": False}

    waited = run_cli("job", "wait", "sl-1", timeout=300)
    assert waited.returncode == 0, waited.stderr[-3000:]
    final = _json(run_cli("job", "status", "sl-1", "-o", "json"))
    assert final["status"] == "SUCCEEDED", final
    model = httpx.get(urls[1] + "/v1/models").json()["data"][0]["id"]
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    before = httpx.post(urls[1] + "/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
    deep = _json(run_cli("sleep", "sleepy", "--replica", "1", "--level", "2", "-o", "json", timeout=120))
    assert [(r["replica"], r["level"]) for r in deep["replicas"]] == [(1, 2)]
    woke2 = _json(run_cli("wake", "sleepy", "--replica", "1", "-o", "json", timeout=120))
    assert [(r["replica"], r["asleep"], r["level"]) for r in woke2["replicas"]] == [(1, False, 2)]
    after = httpx.post(urls[1] + "/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
    assert after == before != GARBLED  # the level-2 wake reloaded the weights
    assert run_cli("sleep", "sleepy", "--replica", "0", timeout=120).returncode == 0
    again = run_cli("up", "-c", str(config), timeout=120)  # waits for readiness: refused at once, not timed out
    assert again.returncode == 4 and "asleep" in again.stderr and "prefect-swarm wake sleepy" in again.stderr
    assert _json(run_cli("status", "sleepy", "-o", "json"))["swarm"]["phase"] == "RUNNING"  # still up
    out = pq.read_table(tmp_path / "out.parquet")
    ids = out.column("id").to_pylist()
    assert len(ids) == n and len(set(ids)) == n  # exactly once
    assert out.column("status").to_pylist().count("ok") == n  # 0 failed rows


@pytest.mark.slow
@pytest.mark.usefixtures("local_backend")
def test_sleep_on_a_swarm_without_sleep_mode_is_refused(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path]
) -> None:
    engine = {"kind": "command", "command": engine_command(module=MODULE), "startup_timeout_s": 60}
    config = stub_swarm_config("awake", replicas=1, engine=engine)
    assert run_cli("up", "-c", str(config), "-o", "json", timeout=120).returncode == 0
    refused = run_cli("sleep", "awake")
    assert refused.returncode == 2 and "engine.sleep_mode" in refused.stderr, refused.stderr


def _config(tmp_path: Path, **data: Any) -> Path:
    base = {"name": "v", "model": "m", "replicas": 1, "engine": {"kind": "vllm", "sleep_mode": True}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**base, **data}))
    return path


def test_validate_refuses_sleep_mode_for_vllm_on_cpu(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _config(tmp_path, gpus_per_replica=0, backend={"type": "local"})
    refused = run_cli("validate", "-c", str(path), "--offline")
    assert refused.returncode == 2, refused.stderr
    text = " ".join(refused.stderr.split())
    assert "engine.sleep_mode" in text and "CUDA and ROCm" in text and "gpus_per_replica" in text


def test_validate_refuses_sleep_mode_on_a_backend_without_it(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _config(tmp_path, gpus_per_replica=1, backend={"type": "external", "url": "http://127.0.0.1:9"})
    refused = run_cli("validate", "-c", str(path), "--offline")
    assert refused.returncode == 2, refused.stderr
    text = " ".join(refused.stderr.split())
    assert "sleep_wake" in text and "external" in text and "someone else" in text


def test_validate_renders_the_flag_and_dev_mode(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _config(tmp_path, gpus_per_replica=1, backend={"type": "local"}, engine={
        "kind": "vllm", "sleep_mode": True, "python": sys.executable})  # fmt: skip
    doc = _json(run_cli("validate", "-c", str(path), "--offline", "-o", "json"))
    text = json.dumps(doc)
    assert "--enable-sleep-mode" in text and "VLLM_SERVER_DEV_MODE" in text
    assert "sleep_wake" in doc["capabilities"]["supported"]
