"""OpenAI Batch output as OpenAI writes it: HTTP errors as responses, refused lines as errors, unique ids."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from _jobkit import requests, run_job, write_spec
from pydantic import ValidationError

from prefect_swarm.jobs.dispatch.runner import _snippet
from prefect_swarm.jobs.rows.commit import commit_output
from prefect_swarm.jobs.spec import JobSpec


def _line(cid: str, **body: Any) -> dict[str, Any]:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": f"hello {cid}"}], **body}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


BATCH = [
    _line("ok-0", max_tokens=4),
    _line("ok-params", max_tokens=6, temperature=0.5, seed=3),
    _line("unknown-model", model="no-such-model"),
    _line("bad-temperature", temperature=5),
    _line("too-many-tokens", max_tokens=100_000),
    _line("stream", stream=True, max_tokens=4),
    _line("ok-1", max_tokens=4),
]


def _run(tmp: Path, stub, output: str, **fields: Any) -> list[dict[str, Any]]:
    src = tmp / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in BATCH))
    spec = write_spec(tmp, input=str(src), output=str(tmp / output), id_column=None, endpoints=[stub.url], **fields)
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    raw = (tmp / output).read_bytes()
    text = gzip.decompress(raw).decode() if output.endswith(".gz") else raw.decode()
    return [json.loads(x) for x in text.splitlines()]


def test_failures_follow_openai_shape(tmp_path: Path, stub) -> None:
    before = requests(stub)
    out = _run(tmp_path, stub, "out.jsonl", max_failed_fraction=1.0)  # no output_format: the name decides
    by_id = {o["custom_id"]: o for o in out}
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in BATCH]
    for cid in ("ok-0", "ok-params", "ok-1"):
        resp = by_id[cid]["response"]
        assert by_id[cid]["error"] is None and resp["status_code"] == 200
        assert resp["request_id"] == resp["body"]["id"] and resp["body"]["object"] == "chat.completion"
    assert by_id["ok-params"]["response"]["body"]["usage"]["completion_tokens"] <= 6
    for cid, code, param in (
        ("unknown-model", 404, "model"),
        ("bad-temperature", 400, "temperature"),
        ("too-many-tokens", 400, "max_tokens"),
    ):
        line = by_id[cid]
        assert line["error"] is None, line
        assert line["response"]["status_code"] == code
        assert line["response"]["request_id"].startswith("req_")
        assert line["response"]["body"]["error"]["param"] == param  # the engine's JSON error, parsed
    stream = by_id["stream"]
    assert stream["response"] is None
    assert stream["error"]["code"] == "invalid_request" and "'stream': true" in stream["error"]["message"]
    assert requests(stub) - before == len(BATCH) - 1  # the stream line was never sent
    ids = [o["id"] for o in out]
    assert len(set(ids)) == len(ids) and all(i.startswith("batch_req_") for i in ids)


def test_line_ids_are_new_for_each_commit(tmp_path: Path, stub) -> None:
    first = _run(tmp_path, stub, "out.jsonl.gz", max_failed_fraction=1.0)  # .gz: written gzip-compressed
    spec = JobSpec.load(tmp_path / "job" / "spec.json")
    assert spec.output_format == "openai-batch"
    commit_output(spec, force=True)
    again = [json.loads(x) for x in gzip.decompress((tmp_path / "out.jsonl.gz").read_bytes()).splitlines()]
    assert [o["custom_id"] for o in again] == [o["custom_id"] for o in first]
    assert not {o["id"] for o in first} & {o["id"] for o in again}


def test_output_format_from_the_name() -> None:
    assert JobSpec(input="a.parquet", output="o.jsonl").output_format == "openai-batch"
    assert JobSpec(input="a.jsonl", output="o.parquet").output_format == "parquet"
    assert JobSpec(input="a.parquet", output="o.data").output_format == "parquet"
    with pytest.raises(
        ValidationError, match=r"o\.jsonl: its name means output_format 'openai-batch', but output_format is 'parquet'"
    ):
        JobSpec(input="a.parquet", output="o.jsonl", output_format="parquet")
    with pytest.raises(ValidationError, match=r"name the output \*\.jsonl"):
        JobSpec(input="a.parquet", output="o.parquet", output_format="openai-batch")


def test_error_text_is_capped_and_stays_valid_json() -> None:
    body = {"error": {"message": "x" * 50_000, "type": "BadRequestError", "param": "messages", "code": 400}}
    short = _snippet(json.dumps(body).encode())
    assert len(short) <= 2100
    parsed = json.loads(short)
    assert parsed["error"]["param"] == "messages" and parsed["error"]["message"].endswith("...")
    many = json.dumps([{"k": i} for i in range(5000)]).encode()
    assert json.loads(_snippet(many))  # cut between values, never inside one
    assert _snippet(b"plain text " * 500).endswith("...")


def test_retries_spent_on_5xx_are_responses_an_outage_is_no_error(tmp_path: Path, stub_factory) -> None:
    """A 5xx whose retries are spent is OpenAI's response (status + the engine's body). No answer at all
    (the swarm is gone) writes no line off: the shard stops resumable (exit 75) and a rerun answers them."""
    failing = stub_factory(error_rate=1.0)
    out = _run(tmp_path, failing, "out.jsonl", max_retries=1, backoff_base_s=0.01, max_failed_fraction=1.0)
    sent = [o for o in out if o["custom_id"].startswith("ok-")]  # the others are refused (400/404) first
    assert len(sent) == 3
    assert all(o["error"] is None and o["response"]["status_code"] in (500, 503) for o in sent)
    assert all(o["response"]["body"] == {"error": {"message": "injected failure"}} for o in sent)
    (tmp_path / "job").rename(tmp_path / "job-5xx")
    failing.stop()  # nothing listens any more: connection errors, an outage
    src = tmp_path / "in.jsonl"
    fields = {"input": str(src), "output": str(tmp_path / "out2.jsonl"), "id_column": None, "max_retries": 0}
    spec = write_spec(tmp_path, endpoints=[failing.url], outage_timeout_s=0.5, max_failed_fraction=1.0, **fields)
    res = run_job(spec)
    assert res.returncode == 75 and "no endpoint of the swarm answered" in res.stderr, res.stderr
    assert not (tmp_path / "out2.jsonl").exists()
    healthy = stub_factory()
    spec = write_spec(tmp_path, endpoints=[healthy.url], max_failed_fraction=1.0, **fields)
    assert run_job(spec).returncode == 0
    out = {o["custom_id"]: o for o in map(json.loads, (tmp_path / "out2.jsonl").read_text().splitlines())}
    assert sorted(out) == sorted(x["custom_id"] for x in BATCH)  # each line once
    assert all(out[cid]["response"]["status_code"] == 200 for cid in ("ok-0", "ok-params", "ok-1"))


def test_a_request_nothing_answered_is_a_request_failed_line() -> None:
    """A row whose retries were spent with no answer (its endpoint answered others meanwhile) is
    written as OpenAI writes a failed request: no response, error code request_failed."""
    from prefect_swarm.jobs.rows.commit import batch_line_result

    response, error = batch_line_result(
        ok=False, raw=None, http_status=0, attempts=3, error="gave up after 3 attempts; last: connection error: x"
    )
    assert response is None and error == {
        "code": "request_failed",
        "message": "gave up after 3 attempts; last: connection error: x",
    }
