"""The external backend against a real vLLM (CPU build, tiny model) that the test starts itself,
outside prefect-swarm, with an API key: `up` (one real completion), a job whose every row reaches
the server exactly once (counted by vLLM's own request counter), a rerun that sends nothing, and
`down`, after which the server still runs and answers."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
import services
from external_kit import KEY_ENV, cli, dataset, external_config, files_holding

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

KEY = services.VLLM_KEY  # the suite's shared server (the ``vllm_server`` fixture), started outside prefect-swarm


def _served(url: str) -> int:
    """Requests vLLM has finished, by its own counter (``vllm:request_success_total``, every finish reason)."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    found = re.findall(r"^vllm:request_success_total\{[^}]*\}\s+([0-9.e+]+)$", text, flags=re.M)
    assert found, text[:2000]
    return round(sum(float(v) for v in found))


def test_a_job_on_an_external_vllm_runs_each_row_exactly_once(
    tmp_path: Path, vllm_server: tuple[str, subprocess.Popen[bytes]], swarm_home: Path
) -> None:
    url, proc = vllm_server
    env = {KEY_ENV: KEY}
    config = external_config(tmp_path, url + "/v1", requests_per_minute=None, tokens_per_minute=None)
    before = _served(url)
    res = cli("up", "-c", str(config), env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _served(url) == before + 1  # readiness: one real completion

    n = 40
    data, out = dataset(tmp_path / "in.parquet", n), tmp_path / "out.parquet"
    kwargs = json.dumps({"sampling": {"max_tokens": 4, "temperature": 0}})
    args = ("job", "submit", "-n", "ext", "--input", str(data), "--output", str(out), "--job-kwargs", kwargs)
    res = cli(*args, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["id"] for r in rows) == [f"r{i:04d}" for i in range(n)]
    assert all(r["status"] == "ok" and isinstance(r["text"], str) and 0 < r["completion_tokens"] <= 4 for r in rows)
    assert _served(url) == before + 1 + n

    res = cli(*args, env=env, timeout=300)  # the same job again: answered from its ledger, nothing sent
    assert res.returncode == 0, res.stdout + res.stderr
    assert _served(url) == before + 1 + n

    res = cli("down", "ext", "-y", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert proc.poll() is None  # down never touches the server
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    assert _served(url) == before + 1 + n
    assert files_holding(swarm_home, KEY) == []


def _tokens_served(url: str) -> tuple[int, int]:
    """Prompt and generation tokens vLLM has processed, by its own counters (what a provider bills)."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    sums = []
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        found = re.findall(rf"^{name}\{{[^}}]*\}}\s+([0-9.e+]+)$", text, flags=re.M)
        assert found, text[:2000]
        sums.append(round(sum(float(v) for v in found)))
    return sums[0], sums[1]


def test_a_token_cap_on_an_external_vllm_is_never_passed_and_a_larger_one_resumes_once(
    tmp_path: Path, vllm_server: tuple[str, subprocess.Popen[bytes]], swarm_home: Path
) -> None:
    """A cent a token: the job's requests reserve their worst case (body / 2 + max_tokens) on the swarm's
    account before they are sent; the bill vLLM counts stays within the cap, the command gives the spend
    at exit, and the swarm brought up again with a larger cap sends only the rows left."""
    url, _ = vllm_server
    env, n, cap = {KEY_ENV: KEY}, 40, 3.0
    prices = {"input_usd_per_million": 1e4, "output_usd_per_million": 1e4}
    config = external_config(
        tmp_path, url + "/v1", requests_per_minute=None, tokens_per_minute=None, cost={**prices, "max_cost_usd": cap}
    )
    assert cli("up", "-c", str(config), env=env, timeout=300).returncode == 0
    served, (pt, ct) = _served(url), _tokens_served(url)
    data, out = dataset(tmp_path / "in.parquet", n), tmp_path / "out.parquet"
    kwargs = json.dumps({"sampling": {"max_tokens": 4, "temperature": 0}})
    args = ("job", "submit", "-n", "ext", "--input", str(data), "--output", str(out), "--job-kwargs", kwargs)
    res = cli(*args, "--id-column", "id", env=env, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "(max_cost_usd) at exit" in res.stderr and "rows left" in res.stderr, res.stderr
    pt2, ct2 = _tokens_served(url)
    bill, sent = (pt2 - pt + ct2 - ct) * 1e4 / 1e6, _served(url) - served
    print(f"vLLM: {sent} requests, ${bill:.2f} of ${cap}")
    assert 0 < sent < n and 0 < bill <= cap, (sent, bill)

    config = external_config(
        tmp_path, url + "/v1", requests_per_minute=None, tokens_per_minute=None, cost={**prices, "max_cost_usd": 1e6}
    )
    assert cli("up", "-c", str(config), env=env, timeout=300).returncode == 0
    res = cli(*args, "--id-column", "id", env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(pq.read_table(out)) == n
    assert _served(url) - served == 1 + n  # the second readiness completion, then every row once across the stop
    assert cli("down", "ext", "-y", env=env).returncode == 0
