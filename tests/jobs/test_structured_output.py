"""Structured output: response_schema sent as response_format, answers validated, typed columns, retries."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, run_job, write_spec

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.api import load_job

MODELS = """
from typing import Literal
from pydantic import BaseModel

class Address(BaseModel):
    city: str

class Review(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: int
    confidence: float
    tags: list[str]
    spam: bool
    address: Address
"""

SCHEMA = {
    "type": "object",
    "title": "Answer",
    "properties": {
        "answer": {"type": "string"},
        "n": {"type": "integer", "minimum": 1},
        "sizes": {"type": "array", "items": {"type": "number"}},
        "meta": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
    },
    "required": ["answer", "n", "sizes", "meta"],
}


def test_invalid_answers_are_retried_until_valid_or_an_error_row(tmp_path: Path, stub_factory) -> None:
    """30% of answers break the schema: every row ends valid (typed columns) or an error row that says why."""
    (tmp_path / "reviews.py").write_text(MODELS)
    stub = stub_factory(invalid_json_rate=0.3, seed=7)
    make_dataset(tmp_path / "in.parquet", 60)
    spec = write_spec(
        tmp_path,
        endpoints=[stub.url],
        max_failed_fraction=1.0,
        job_kwargs={"response_schema": "reviews:Review", "schema_retries": 2, "sampling": {"max_tokens": 64}},
    )
    res = run_job(spec, env={"PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    table = pq.read_table(tmp_path / "job-out.parquet")
    schema = table.schema
    assert schema.field("label").type == pa.string() and schema.field("score").type == pa.int64()
    assert schema.field("confidence").type == pa.float64() and schema.field("spam").type == pa.bool_()
    assert schema.field("tags").type == pa.list_(pa.string()) and schema.field("address").type == pa.string()
    rows = table.to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    bad = [r for r in rows if r["status"] != "ok"]
    assert len(ok) + len(bad) == 60 and len(ok) >= 50
    for r in ok:
        assert r["label"] in ("positive", "negative", "neutral") and isinstance(r["score"], int)
        assert isinstance(r["tags"], list) and json.loads(r["address"])["city"]
        assert json.loads(r["text"])["label"] == r["label"]  # the raw text is kept
    retried = [r for r in ok if r["schema_error"]]
    assert retried and all("does not match Review" in r["schema_error"] for r in retried)
    for r in bad:
        assert r["error"].startswith("answer still invalid after 3 tries: the answer does not match Review")
        assert r["label"] is None
    assert stub.stats()["invalid_json"] >= len(retried) + 3 * len(bad)


def test_json_schema_file_gives_typed_columns(tmp_path: Path, stub) -> None:
    (tmp_path / "answer.json").write_text(json.dumps(SCHEMA))
    make_dataset(tmp_path / "in.parquet", 20)
    kwargs = {"response_schema": str(tmp_path / "answer.json"), "sampling": {"max_tokens": 64}}
    res = run_job(write_spec(tmp_path, endpoints=[stub.url], job_kwargs=kwargs))
    assert res.returncode == 0, res.stderr
    table = pq.read_table(tmp_path / "job-out.parquet")
    assert table.schema.field("n").type == pa.int64()
    assert table.schema.field("sizes").type == pa.list_(pa.float64())
    rows = table.to_pylist()
    assert all(r["status"] == "ok" and r["n"] >= 1 and json.loads(r["meta"])["k"] for r in rows)
    assert all(r["schema_error"] is None for r in rows)


def test_schema_refusals(tmp_path: Path) -> None:
    (tmp_path / "answer.json").write_text(json.dumps(SCHEMA))
    with pytest.raises(ConfigError, match="needs a job whose answers are text"):
        load_job("openai-batch", {"response_schema": str(tmp_path / "answer.json")})
    clash = {"type": "object", "properties": {"text": {"type": "string"}}}
    (tmp_path / "clash.json").write_text(json.dumps(clash))
    with pytest.raises(ConfigError, match="text would collide"):
        load_job("chat", {"response_schema": str(tmp_path / "clash.json")})
    with pytest.raises(ConfigError, match="neither an existing JSON Schema file nor 'module:Model'"):
        load_job("chat", {"response_schema": "nothing-here"})
    (tmp_path / "list.json").write_text(json.dumps({"type": "array"}))
    with pytest.raises(ConfigError, match="must describe a JSON object"):
        load_job("chat", {"response_schema": str(tmp_path / "list.json")})
    job = load_job("chat", {"response_schema": str(tmp_path / "answer.json")})
    body = job.body({"prompt": "hi"})
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA
    assert "response_format" not in load_job("chat").body({"prompt": "hi"})


def test_cli_response_schema_flags(tmp_path: Path) -> None:
    """`job submit --response-schema FILE --schema-retries N` on a stub swarm: typed columns in the output."""
    from typer.testing import CliRunner

    from prefect_swarm.cli.job import job_app
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    (tmp_path / "answer.json").write_text(json.dumps(SCHEMA))
    make_dataset(tmp_path / "in.parquet", 12)
    argv = ["submit", "-n", "schema-stub", "--input", str(tmp_path / "in.parquet"), "--output"]
    argv += [str(tmp_path / "out.parquet"), "--id-column", "id", "--response-schema", str(tmp_path / "answer.json")]
    argv += ["--schema-retries", "1", "--job-kwargs", '{"sampling": {"max_tokens": 64}}']
    with Swarm(SwarmConfig.model_validate(stub_swarm_config("schema-stub"))):
        res = CliRunner().invoke(job_app, argv)
    assert res.exit_code == 0, res.output
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("n").type == pa.int64() and table.num_rows == 12
    assert all(r["status"] == "ok" for r in table.to_pylist())


def test_an_edited_schema_changes_the_job_fingerprint(tmp_path: Path) -> None:
    """A checkpoint checked against one schema must not be resumed under an edited one of the same name."""
    from prefect_swarm.jobs.checkpoint.fingerprint import job_fingerprint
    from prefect_swarm.jobs.spec import JobSpec

    make_dataset(tmp_path / "in.parquet", 5)
    schema_file = tmp_path / "answer.json"
    schema_file.write_text(json.dumps(SCHEMA))
    kwargs = {"response_schema": str(schema_file)}
    spec = JobSpec.model_validate(json.loads(write_spec(tmp_path, job_kwargs=kwargs).read_text()))
    before = job_fingerprint(spec)
    assert job_fingerprint(spec) == before
    schema_file.write_text(json.dumps({**SCHEMA, "required": ["answer"]}))
    assert job_fingerprint(spec) != before
