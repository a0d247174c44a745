"""The external backend: a swarm that is an OpenAI-compatible endpoint someone else runs.

Against the stub engine started by the test (tests/external/test_external_vllm.py: the vLLM CPU
server): config validation, `up` (one real completion), `status`, `job submit` exactly once, the
rate limit held by the job's request loop (measured at the server), `down` that never touches it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from external_kit import KEY_ENV, cli, dataset, external_config, files_holding, popen_cli

from prefect_swarm.config import SwarmConfig, load_config
from prefect_swarm.config.cost import job_cost
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.dispatch.ratelimit import Bucket, estimate_tokens
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine

KEY = "sk-external-test-key-81f3"
SAMPLING = json.dumps({"sampling": {"max_tokens": 4}})


def _cfg(**backend: Any) -> dict[str, Any]:
    return {"name": "ext", "model": "tiny", "backend": {"type": "external", "url": "http://127.0.0.1:9/v1", **backend}}


def test_an_external_config_validates() -> None:
    cfg = load_config(data=_cfg(api_key_env=KEY_ENV, max_concurrency=8, requests_per_minute=60))
    assert cfg.backend.type == "external" and cfg.backend.base_url == "http://127.0.0.1:9"
    assert cfg.gpus_per_replica == 0  # no GPUs of ours: no GPU-hours
    assert Swarm(cfg).validate(ask=False) == [f"backend.api_key_env: ${KEY_ENV} is not set here; `up` and jobs need it"]
    assert load_config(Path(__file__).parents[2] / "examples" / "external.yaml").backend.type == "external"


@pytest.mark.parametrize(
    ("backend", "top", "says"),
    [
        ({"url": None}, {}, "backend.url"),
        ({"url": "ftp://host/v1"}, {}, "backend.url"),
        ({"url": "https://user:pw@api.example.com/v1"}, {}, "carries credentials"),
        ({"api_key_env": "1-BAD"}, {}, "backend.api_key_env"),
        ({"api_key_env": "A", "api_key_secret": "b"}, {}, "not both"),
        ({"requests_per_minute": 0}, {}, "backend.requests_per_minute"),
        ({"max_concurrency": 0}, {}, "backend.max_concurrency"),
        ({"cost": {"max_gpu_hours": 1}}, {}, "holds no GPUs of ours"),
        ({"cost": {"gpu_hour_usd": 2, "max_cost_usd": 5}}, {}, "bill is its tokens"),
        ({"lb_port": 9000}, {}, "lb_port"),
        ({}, {"stage": {"to": "/local"}}, "stage"),
    ],
)
def test_a_bad_external_config_names_the_field(backend: dict[str, Any], top: dict[str, Any], says: str) -> None:
    data = _cfg(**backend)
    data["backend"] = {k: v for k, v in data["backend"].items() if v is not None}
    with pytest.raises(ConfigError) as err:
        load_config(data={**data, **top})
    assert says in str(err.value)


def test_the_backend_has_every_seam_and_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    from prefect_swarm.interfaces import ComputeBackend, ServingBackend, ServingHandle

    swarm = Swarm(load_config(data=_cfg(api_key_env=KEY_ENV)))
    assert isinstance(swarm.backends.serving, ServingBackend)
    assert isinstance(swarm.backends.compute(None), ComputeBackend)
    handle = ServingHandle(name="ext", backend="external", url="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="has no replica logs prefect-swarm can read"):
        next(iter(swarm.backends.serving.replica_log(handle, 0)))
    with pytest.raises(ConfigError, match="needs exec, which the external backend lacks"):
        swarm.backends.serving.exec_command(handle, 0, ["true"])
    assert swarm.backends.serving.status(handle).phase == "UNKNOWN"  # nothing listens: unknown, not failed


def test_more_than_one_replica_is_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="replicas: 2 asked, the external backend runs at most 1"):
        Swarm(SwarmConfig.model_validate({**_cfg(), "replicas": 2})).validate()


def test_limits_price_and_key_source_are_not_the_engine_identity() -> None:
    """Lowering a rate limit after 429s (or moving the key) resumes the same checkpoints; another URL or
    model does not."""
    from prefect_swarm.swarm import engine_fingerprint

    base = engine_fingerprint(load_config(data=_cfg(api_key_env="A")))
    tuned = _cfg(api_key_secret="b", max_concurrency=4, requests_per_minute=30, tokens_per_minute=1000)
    tuned["backend"]["cost"] = {"input_usd_per_million": 2.0}
    assert engine_fingerprint(load_config(data=tuned)) == base
    assert engine_fingerprint(load_config(data=_cfg(url="http://127.0.0.1:10"))) != base
    assert engine_fingerprint(load_config(data={**_cfg(), "model": "other"})) != base


def test_token_prices_make_the_job_cost() -> None:
    cfg = load_config(data=_cfg(cost={"input_usd_per_million": 1.0, "output_usd_per_million": 4.0}))
    progress = {"prompt_tokens": 2_000_000, "completion_tokens": 500_000, "shards": []}
    cost = job_cost(progress, cfg.redacted())
    assert cost["usd"] == 4.0 and cost["source"] == "tokens" and cost["gpu_hours"] == 0
    assert cost["usd_per_million_tokens"] == 1.6


def test_the_bucket_holds_its_rate_over_any_window() -> None:
    now = [0.0]
    bucket = Bucket(120, clock=lambda: now[0])  # 2 a second, one second's worth of burst
    sent = []
    while now[0] < 30:
        wait = bucket.wait_s(1)
        now[0] += wait
        bucket.take(1)
        sent.append(now[0])
    for start in sent:
        in_window = [t for t in sent if start <= t < start + 10]
        assert len(in_window) <= 2 * 10 + 2
    assert 58 <= len(sent) <= 62
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 7}).encode()
    assert estimate_tokens(body) == len(body) // 4 + 7


def test_tokens_per_minute_counts_the_estimate_then_the_reported_usage() -> None:
    """24,000 tokens/min = 400/s (400 of burst); requests estimated at 100 tokens: 4 at once, then 4/s.
    An answer that reports 300 tokens used puts the bucket 200 further behind."""
    import asyncio

    from prefect_swarm.jobs.dispatch.ratelimit import RateLimiter

    body = json.dumps({"messages": [], "max_tokens": 100 - len(b'{"messages": [], "max_tokens": 100}') // 4}).encode()
    assert estimate_tokens(body) == 100

    async def send(n: int, used: int | None = None) -> float:
        limiter = RateLimiter(tokens_per_minute=24_000)
        started = time.monotonic()
        for _ in range(n):
            estimate = await limiter.acquire(body)
            if used is not None:
                limiter.settle(estimate, json.dumps({"usage": {"total_tokens": used}}).encode())
        return time.monotonic() - started

    plain = asyncio.run(send(12))
    assert 8 / 4 * 0.9 <= plain < 8 / 4 + 3, plain  # 8 past the burst at 4/s
    heavy = asyncio.run(send(6, used=300))
    assert heavy >= (5 * 300 + 100 - 400) / 400 * 0.9, heavy  # the 6th waits for 5 answers' usage, not estimates


@pytest.fixture
def keyed_stub() -> Any:
    with StubEngine(free_port(), api_key=KEY, model="tiny") as stub:
        yield stub


def _sent(stub: StubEngine) -> int:
    return int(stub.stats().get("requests", 0))


def test_cli_up_status_job_down_on_a_stub_it_never_stops(
    tmp_path: Path, keyed_stub: StubEngine, swarm_home: Path
) -> None:
    env = {KEY_ENV: KEY}
    config = external_config(tmp_path, keyed_stub.url + "/v1", requests_per_minute=None, tokens_per_minute=None)
    res = cli("up", "-c", str(config), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _sent(keyed_stub) == 1  # readiness: one real completion

    res = cli("status", "ext", "-o", "json", "--no-history", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["status"]["phase"] == "RUNNING"

    n = 40
    data, out = dataset(tmp_path / "in.parquet", n), tmp_path / "out.parquet"
    args = ("job", "submit", "-n", "ext", "--input", str(data), "--output", str(out), "--id-column", "id")
    res = cli(*args, "--job-kwargs", SAMPLING, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["id"] for r in rows) == [f"r{i:04d}" for i in range(n)]
    assert all(r["status"] == "ok" for r in rows)
    assert _sent(keyed_stub) == 1 + n  # each row exactly once

    res = cli(*args, "--job-kwargs", SAMPLING, env=env)  # the same job again: its ledger says done
    assert res.returncode == 0, res.stdout + res.stderr
    assert _sent(keyed_stub) == 1 + n

    res = cli("down", "ext", "-y", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert httpx.get(keyed_stub.url + "/health", headers=keyed_stub.headers, timeout=5).status_code == 200
    assert _sent(keyed_stub) == 1 + n  # down sent nothing
    assert keyed_stub.proc is not None and keyed_stub.proc.poll() is None
    assert StateStore().require_swarm("ext").phase == "STOPPED"
    assert files_holding(swarm_home, KEY) == []  # no state row, spec, log or key file holds it


def test_up_without_the_key_names_the_variable(tmp_path: Path, keyed_stub: StubEngine) -> None:
    config = external_config(tmp_path, keyed_stub.url)
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    os.environ.pop(KEY_ENV, None)
    res = cli("up", "-c", str(config), env=env)
    assert res.returncode != 0
    assert f"${KEY_ENV} is not set" in res.stdout + res.stderr
    res = cli("up", "-c", str(config), env={KEY_ENV: "wrong"})
    assert res.returncode != 0
    assert "HTTP 401" in res.stdout + res.stderr and "backend.api_key_env" in res.stdout + res.stderr
    assert _sent(keyed_stub) == 1  # the refused readiness completion; nothing else was sent


def test_a_job_without_the_key_names_where_it_was_looked_for(
    tmp_path: Path, keyed_stub: StubEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = external_config(tmp_path, keyed_stub.url + "/v1")
    res = cli("up", "-c", str(config), env={KEY_ENV: KEY})
    assert res.returncode == 0, res.stdout + res.stderr
    data, out = dataset(tmp_path / "in.parquet", 5), tmp_path / "out.parquet"
    args = ("job", "submit", "-n", "ext", "--input", str(data), "--output", str(out), "--id-column", "id")
    monkeypatch.delenv(KEY_ENV, raising=False)
    for env, state in (({}, "not set here"), ({KEY_ENV: "sk-wrong-key-0000"}, "set")):
        res = cli(*args, "--job-kwargs", SAMPLING, env=env)
        said = res.stdout + res.stderr
        assert res.returncode == 2, said
        # the places, in the order tried: the swarm's own, then the variable its config names
        assert (
            said.index("$PREFECT_SWARM_API_KEY (not set here)")
            < said.index("swarm.key")
            < said.index(f"${KEY_ENV}, named by backend.api_key_env ({state})")
        ), said
        assert "sk-wrong-key-0000" not in said
    assert _sent(keyed_stub) == 1  # up's readiness completion; no row was sent
    assert not out.exists()


def test_the_job_holds_requests_per_minute_across_its_shards(tmp_path: Path, keyed_stub: StubEngine) -> None:
    """R = 300/min over 2 shards (each 2.5/s, 2.5 of burst): sampled at the server, no 2 s window sees
    more than R x 2 s plus the bursts, and the whole job cannot finish faster than R allows."""
    rpm, n = 300, 24
    env = {KEY_ENV: KEY}
    config = external_config(tmp_path, keyed_stub.url, requests_per_minute=rpm, tokens_per_minute=None)
    assert cli("up", "-c", str(config), env=env).returncode == 0
    base = _sent(keyed_stub)
    data, out = dataset(tmp_path / "in.parquet", n), tmp_path / "out.parquet"
    proc = popen_cli(
        "job", "submit", "-n", "ext", "--input", str(data), "--output", str(out), "--shards", "2",
        "--job-kwargs", SAMPLING, env=env,
    )  # fmt: skip
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), _sent(keyed_stub) - base))
            time.sleep(0.1)  # the point: a sample every 0.1 s, the rate over time is what is measured

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        stop.set()
        sampler.join()
    samples.append((time.monotonic(), _sent(keyed_stub) - base))
    assert proc.returncode == 0, output
    assert samples[-1][1] == n
    per_s, burst, window = rpm / 60, 2 * max(1.0, rpm / 60 / 2), 2.0
    for t0, c0 in samples:
        later = [c for t, c in samples if t0 <= t <= t0 + window]
        assert max(later) - c0 <= per_s * window + burst + 1, (t0, samples)
    first = next(t for t, c in samples if c > 0)
    span = samples[-1][0] - first
    assert span >= (n - burst - 1) / per_s * 0.9, span  # the limit, not the stub, paced the job
    print(
        f"{n} requests at R={rpm}/min over 2 shards in {span:.1f}s: {(n - burst) / span * 60:.0f}/min past the bursts"
    )
    assert cli("down", "ext", "-y", env=env).returncode == 0


def test_a_token_budget_stops_the_job_resumable_and_a_larger_one_finishes_it_exactly_once(
    tmp_path: Path, keyed_stub: StubEngine
) -> None:
    """$1 a token (a row: ~6 tokens), a $150 cap: the job's processes hold it on their own tokens (paced at
    10 requests/s, a check a second), stop resumable with the cap named; `up` with a larger cap, the same
    submit sends only the rows left."""
    env, n = {KEY_ENV: KEY}, 100
    cost = {"input_usd_per_million": 1e6, "output_usd_per_million": 1e6, "max_cost_usd": 150}
    config = external_config(tmp_path, keyed_stub.url, requests_per_minute=600, tokens_per_minute=None, cost=cost)
    assert cli("up", "-c", str(config), env=env).returncode == 0
    data, out = dataset(tmp_path / "in.parquet", n), tmp_path / "out.parquet"
    args = ("job", "submit", "-n", "ext", "--input", str(data), "--output", str(out), "--id-column", "id")
    res = cli(*args, "--job-kwargs", SAMPLING, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "budget reached: $" in res.stdout + res.stderr and "(max_cost_usd)" in res.stdout + res.stderr
    first = _sent(keyed_stub) - 1
    assert 0 < first < n * 3 / 4, first  # the cap is ~25 rows; a loaded machine checks late
    assert not out.exists()

    config = external_config(
        tmp_path, keyed_stub.url, requests_per_minute=None, tokens_per_minute=None, cost={**cost, "max_cost_usd": 1e6}
    )
    assert cli("up", "-c", str(config), env=env).returncode == 0
    res = cli(*args, "--job-kwargs", SAMPLING, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(pq.read_table(out)) == n
    assert _sent(keyed_stub) == 2 + n  # two readiness completions; every row once across the stop
    assert "from tokens" in res.stdout
    assert cli("down", "ext", "-y", env=env).returncode == 0
