"""A real vLLM (CPU build, tiny model): a 2,000-row chat job in 4 shards."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
import services
from _jobkit import job_argv, make_dataset, write_spec

from prefect_swarm.testing import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM server for the module (stopped by its process group)."""
    services.gate(services.missing_vllm())
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    argv = [
        str(services.vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(services.tiny_model()),
        "--served-model-name",
        "tiny",
        *services.VLLM_ARGS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **services.VLLM_ENV},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_chat_job_2000_rows_4_shards_on_vllm(tmp_path: Path, vllm_url: str) -> None:
    make_dataset(tmp_path / "in.parquet", 2000, row_group=300)
    spec = write_spec(
        tmp_path,
        model="tiny",
        concurrency=16,
        shards=4,
        job_kwargs={"system_prompt": "Answer briefly.", "sampling": {"max_tokens": 4, "temperature": 0}},
    )
    env = {**os.environ, "PREFECT_SWARM_ENDPOINTS": vllm_url}
    started = time.monotonic()
    procs = [subprocess.Popen(job_argv(spec, i, 4), env=env, stderr=subprocess.PIPE, text=True) for i in range(4)]
    codes = [p.wait(600) for p in procs]
    assert codes == [0, 0, 0, 0], [p.stderr.read()[-2000:] for p in procs if p.stderr]
    elapsed = time.monotonic() - started
    rows = pq.read_table(tmp_path / "job-out.parquet").to_pylist()
    assert len(rows) == 2000
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(2000)]
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"][:3]
    assert all(r["prompt_tokens"] > 0 and 0 < r["completion_tokens"] <= 4 for r in rows)
    assert all(isinstance(r["text"], str) and r["finish_reason"] in ("length", "stop") for r in rows)
    print(
        f"vLLM: 2000 rows, 4 shards in {elapsed:.1f}s; tokens "
        f"{sum(r['prompt_tokens'] for r in rows)}+{sum(r['completion_tokens'] for r in rows)}"
    )
