"""``samples``: n answers per row from one request (OpenAI's ``n``), as list columns, exactly once
across a kill -9 and a resume; refused up front when it clashes, an error row when the engine
answers with fewer choices than asked."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _jobkit import job_argv, make_dataset, requests, run_job, write_spec

from prefect_swarm.exceptions import ConfigError, InvalidAnswer
from prefect_swarm.jobs.api import load_job
from prefect_swarm.paths import JobPaths
from prefect_swarm.testing.stub_engine import answer


@pytest.mark.parametrize(("ref", "path"), [("chat", "/v1/chat/completions"), ("completion", "/v1/completions")])
def test_one_request_asks_for_n_and_each_answer_lands_in_the_lists(ref: str, path: str) -> None:
    job = load_job(ref, {"samples": 4, "sampling": {"max_tokens": 8}})
    body = job.body({"prompt": "why is the sky blue"})
    assert body["n"] == 4 and body["max_tokens"] == 8
    assert job.outputs["text"] == pa.list_(pa.string()) and job.outputs["finish_reason"] == pa.list_(pa.string())
    out = job.parser()(answer(path, {**body, "model": "m"}, "m"))
    assert len(out["text"]) == 4 and len(set(out["text"])) == 4  # four different answers, in choice order
    assert out["text"][1].endswith("#1") and len(out["finish_reason"]) == 4
    single = load_job(ref, {"sampling": {"max_tokens": 8}})  # samples=1: plain strings, as before
    assert "n" not in single.body({"prompt": "x"}) and single.outputs["text"] == pa.string()


def test_an_engine_that_ignores_n_gets_the_row_refused_not_shortened() -> None:
    job = load_job("chat", {"samples": 3})
    one = answer("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "m")
    with pytest.raises(InvalidAnswer, match=r"asked for 3 answers .* returned 1"):
        job.parser()(one)


@pytest.mark.parametrize(
    ("kwargs", "wanted"),
    [
        ({"samples": 0}, "samples must be a whole number"),
        ({"samples": "4"}, "samples must be a whole number"),
        ({"samples": 2, "sampling": {"n": 2}}, "not also sampling.n"),
    ],
)
def test_bad_samples_are_refused_naming_the_field(kwargs: dict, wanted: str) -> None:
    with pytest.raises(ConfigError, match=wanted):
        load_job("chat", kwargs)


def test_samples_with_a_response_schema_is_refused(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}')
    with pytest.raises(ConfigError, match="samples > 1 and response_schema"):
        load_job("chat", {"samples": 2, "response_schema": str(schema)})


def test_four_answers_per_row_exactly_once_across_a_kill_and_resume(tmp_path: Path, stub, stub_factory) -> None:
    n = 1200
    make_dataset(tmp_path / "in.parquet", n)
    kwargs = {"samples": 4, "sampling": {"max_tokens": 8, "temperature": 0}}
    ref = write_spec(tmp_path, "ref", endpoints=[stub.url], job_kwargs=kwargs)
    assert run_job(ref).returncode == 0
    slow = stub_factory(latency_ms=20)  # ~800 rows/s at c=16: the kill lands mid-job
    spec = write_spec(
        tmp_path, "killed", endpoints=[slow.url], job_kwargs=kwargs, concurrency=16,
        checkpoint_every=100, checkpoint_seconds=0.3,
    )  # fmt: skip
    proc = subprocess.Popen(job_argv(spec), stderr=subprocess.DEVNULL)
    shard = JobPaths(tmp_path / "killed").shard(0)
    deadline = time.monotonic() + 120
    while not shard.parts() and proc.poll() is None:  # killed once a checkpoint is on disk
        assert time.monotonic() < deadline, "no checkpoint in 120 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = requests(slow)
    assert first < n, "the job ended before the kill"
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    assert requests(slow) - first < n  # the rerun resumed: it did not ask every row again
    got, want = pq.read_table(tmp_path / "killed-out.parquet"), pq.read_table(tmp_path / "ref-out.parquet")
    assert got.num_rows == n and len(set(got.column("id").to_pylist())) == n
    texts = got.column("text").to_pylist()
    assert all(len(t) == 4 for t in texts)
    assert texts == want.column("text").to_pylist()  # the same answers as the run never killed
    assert got.column("completion_tokens").to_pylist() == want.column("completion_tokens").to_pylist()
