"""With the real vLLM (CPU build, tiny model): OpenAI Batch interop with `vllm run-batch`, and structured output.

`vllm run-batch` runs once on the batch file; the jobs run on a swarm of the external backend aimed at
the suite's shared vLLM server of the same model (the ``vllm_server`` fixture): a vLLM start costs
~25 CPU-s, and the local backend's vLLM replicas have tests of their own (tests/local/test_local_vllm.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import services

from prefect_swarm.config import SwarmConfig
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.launch import submit_job
from prefect_swarm.swarm import Swarm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _line(cid: str, **body: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"Say {cid}"}], "max_tokens": 4, **body}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


BATCH = [
    _line("ok-greedy", temperature=0),
    _line("ok-params", temperature=0, max_tokens=3, seed=7, top_p=0.9),
    _line("unknown-model", model="no-such-model"),
    _line("bad-temperature", temperature=-1),
    _line("too-many-tokens", max_tokens=100_000),
    _line("stream", stream=True, temperature=0),
    _line("ok-last", temperature=0, max_tokens=2),
]
OK = ("ok-greedy", "ok-params", "ok-last")
MAX_TOKENS = {x["custom_id"]: x["body"]["max_tokens"] for x in BATCH}
HTTP_ERRORS = ("unknown-model", "bad-temperature", "too-many-tokens")


@pytest.fixture(scope="module")
def batch_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("batch") / "batch.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in BATCH))
    return path


@pytest.fixture(scope="module")
def run_batch_output(batch_file: Path) -> dict[str, dict[str, Any]]:
    """`vllm run-batch` over the batch file: its output lines by custom_id."""
    services.gate(services.missing_vllm())
    out = batch_file.with_name("run-batch-out.jsonl")
    # `vllm run-batch` runs this same module's main; the CPU build here has no package metadata, which
    # the `vllm` console script reads for its --version, so the module is called directly.
    argv = [str(services.vllm_python()), "-m", "vllm.entrypoints.openai.run_batch", "-i", str(batch_file)]
    argv += ["-o", str(out), "--model", str(services.tiny_model()), "--served-model-name", "tiny", *services.VLLM_ARGS]
    res = subprocess.run(argv, env={**os.environ, **services.VLLM_ENV}, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == [x["custom_id"] for x in BATCH]
    return {x["custom_id"]: x for x in lines}


@pytest.fixture(scope="module")
def swarm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PREFECT_SWARM_HOME of the module's swarm and of the jobs run on it."""
    return tmp_path_factory.mktemp("vllm-batch-home")


@pytest.fixture(scope="module")
def module_swarm(
    run_batch_output: dict[str, Any], swarm_home: Path, vllm_server: tuple[str, subprocess.Popen[bytes]]
) -> Iterator[Swarm]:
    """The shared vLLM server as an external swarm, ready (up after run-batch ended); down at the end
    of the module (the server runs on)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_SWARM_HOME", str(swarm_home))
        mp.setenv("VLLM_BATCH_TEST_KEY", services.VLLM_KEY)  # read by up and by the job processes
        backend = {"type": "external", "url": vllm_server[0] + "/v1", "api_key_env": "VLLM_BATCH_TEST_KEY"}
        cfg = SwarmConfig.model_validate({"name": "vllm-batch", "model": "tiny", "backend": backend})
        with Swarm(cfg) as s:
            yield s


@pytest.fixture
def swarm(module_swarm: Swarm, swarm_home: Path, monkeypatch: pytest.MonkeyPatch) -> Swarm:
    """The module's swarm, with this test's PREFECT_SWARM_HOME set to the swarm's (jobs are recorded there)."""
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(swarm_home))
    return module_swarm


def test_openai_batch_output_matches_run_batch(
    tmp_path: Path, batch_file: Path, run_batch_output: dict[str, dict[str, Any]], swarm: Swarm
) -> None:
    spec = JobSpec(input=str(batch_file), output=str(tmp_path / "out.jsonl"), max_failed_fraction=1.0)
    rec = submit_job(swarm, spec, detach=False)
    assert rec.status == "SUCCEEDED", rec
    ours = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [x["custom_id"] for x in ours] == [x["custom_id"] for x in BATCH]  # input order
    by_id = {x["custom_id"]: x for x in ours}
    for cid in OK:  # successes: the same shape, field for field
        mine, theirs = by_id[cid], run_batch_output[cid]
        assert set(mine) == set(theirs) and mine["error"] is None and theirs["error"] is None
        assert set(mine["response"]) == set(theirs["response"])
        a, b = mine["response"]["body"], theirs["response"]["body"]
        assert set(a) == set(b) and set(a["usage"]) == set(b["usage"])
        assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
        assert (
            a["usage"]["completion_tokens"] <= BATCH[[x["custom_id"] for x in BATCH].index(cid)]["body"]["max_tokens"]
        )
        assert set(a["choices"][0]) == set(b["choices"][0])
    for cid in HTTP_ERRORS:  # OpenAI's shape: the HTTP error is the response, error is null
        mine, theirs = by_id[cid], run_batch_output[cid]
        assert mine["error"] is None, mine
        assert mine["response"]["status_code"] == theirs["response"]["status_code"] >= 400, (mine, theirs)
        error = mine["response"]["body"]["error"]
        assert isinstance(error["message"], str) and error["message"], mine
        assert set(error) >= {"message", "type", "code"}
    stream = by_id["stream"]  # refused before sending: no HTTP answer, so OpenAI's error object
    assert stream["response"] is None and stream["error"]["code"] == "invalid_request"
    assert run_batch_output["stream"]["response"]["status_code"] == 400  # run-batch refuses it too
    ids = [x["id"] for x in ours]
    assert len(set(ids)) == len(ids)


SCHEMA = {
    "title": "Verdict",
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["yes", "no", "maybe"]},
        "level": {"type": "integer", "enum": [1, 2, 3]},
        "sure": {"type": "boolean"},
    },
    "required": ["label", "level", "sure"],
    "additionalProperties": False,
}


def test_structured_output_with_guided_decoding(tmp_path: Path, swarm: Swarm) -> None:
    (tmp_path / "verdict.json").write_text(json.dumps(SCHEMA))
    n = 50
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(n)], "prompt": [f"Is {i} even?" for i in range(n)]}),
                   tmp_path / "in.parquet")  # fmt: skip
    spec = JobSpec(
        input=str(tmp_path / "in.parquet"),
        output=str(tmp_path / "out.parquet"),
        id_column="id",
        job_kwargs={
            "response_schema": str(tmp_path / "verdict.json"),
            "sampling": {"max_tokens": 48, "temperature": 0},
        },
    )
    started = time.monotonic()
    rec = submit_job(swarm, spec, detach=False)
    assert rec.status == "SUCCEEDED", rec
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("label").type == pa.string() and table.schema.field("level").type == pa.int64()
    assert table.schema.field("sure").type == pa.bool_()
    rows = table.to_pylist()
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"][:3]
    assert all(r["label"] in ("yes", "no", "maybe") and r["level"] in (1, 2, 3) for r in rows)
    assert all(isinstance(r["sure"], bool) and json.loads(r["text"])["label"] == r["label"] for r in rows)
    print(f"structured output: {n} rows in {time.monotonic() - started:.1f}s")
