"""The batch service through the real openai SDK on loopback: Files and Batches as OpenAI serves them,
outputs line for line what `prefect-swarm job submit --job openai-batch` writes, bad files refused
with OpenAI's per-line errors before any request, limits enforced while the upload streams, and two
tenants that cannot see, read, cancel or delete each other's objects on any route."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from service_kit import Service, chat_line, jsonl, lines_of, wait_batch

from prefect_swarm.testing.stub_engine import StubEngine, stub_swarm_config

pytestmark = pytest.mark.slow
MODEL = "stub-model"


@pytest.fixture(scope="module")
def svc(service_factory) -> Service:
    cfg = stub_swarm_config("svc-stub")
    return service_factory({MODEL: cfg}, max_requests=40, max_file_bytes=64 * 1024, idle_release_s=600)


@pytest.fixture(scope="module")
def alice(svc: Service) -> Any:
    return svc.client(svc.key("alice"))


def _engine_requests(svc: Service) -> int:
    """Requests the swarm's engine answered so far (0 while it is not up)."""
    cfg = yaml.safe_load(svc.config.read_text())["models"][MODEL]
    try:
        return int(StubEngine(cfg["port"]).stats().get("requests", 0))
    except Exception:
        return 0


def _normal(line: dict[str, Any]) -> dict[str, Any]:
    """A line without what is new on each run: the line id, and a request id made up for an answer
    without one of its own (an error; an embedding)."""
    out = {k: v for k, v in line.items() if k != "id"}
    response = out.get("response")
    if response and response["request_id"] != (response.get("body") or {}).get("id"):
        out["response"] = {k: v for k, v in response.items() if k != "request_id"}
    return out


def _job_submit(svc: Service, src: Path, tmp: Path) -> list[dict[str, Any]]:
    """What `prefect-swarm job submit --job openai-batch` writes for ``src`` on the service's swarm."""
    out = tmp / f"{src.stem}.out.jsonl"
    res = svc.cli("job", "submit", "-n", "svc-stub", "--input", str(src), "--output", str(out),
                  "--job", "openai-batch", "--max-failed-fraction", "1")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in out.read_text().splitlines()]


def _run(client: Any, src: Path, endpoint: str, **kw: Any) -> Any:
    upload = client.files.create(file=src.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h", **kw)
    assert batch.status == "validating" and batch.input_file_id == upload.id
    return wait_batch(client, batch.id)


def test_chat_batch_as_openai_and_as_job_submit(svc: Service, alice: Any, tmp_path: Path) -> None:
    good = [chat_line(f"c{i}") for i in range(8)]
    src = jsonl(tmp_path / "chat.jsonl", [*good[:4], chat_line("bad-temp", temperature=5), *good[4:]])
    batch = _run(alice, src, "/v1/chat/completions", metadata={"team": "search"})
    assert batch.status == "completed" and batch.errors is None and batch.metadata == {"team": "search"}
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (9, 8, 1)
    assert batch.model == MODEL
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.usage.output_tokens > 0
    out, err = lines_of(alice, batch.output_file_id), lines_of(alice, batch.error_file_id)
    assert [x["custom_id"] for x in out] == [x["custom_id"] for x in good]
    assert [x["custom_id"] for x in err] == ["bad-temp"] and err[0]["response"]["status_code"] == 400
    for fid in (batch.output_file_id, batch.error_file_id):
        assert alice.files.retrieve(fid).purpose == "batch_output"
    reference = _job_submit(svc, src, tmp_path)
    assert sorted(map(json.dumps, map(_normal, out + err))) == sorted(map(json.dumps, map(_normal, reference)))
    assert len({x["id"] for x in out + err}) == 9


def test_embeddings_batch_as_openai_and_as_job_submit(svc: Service, alice: Any, tmp_path: Path) -> None:
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": f"t {i}"}}
        for i in range(6)
    ]
    src = jsonl(tmp_path / "emb.jsonl", lines)
    batch = _run(alice, src, "/v1/embeddings")
    assert batch.status == "completed" and batch.error_file_id is None
    out = lines_of(alice, batch.output_file_id)
    assert [x["custom_id"] for x in out] == [f"e{i}" for i in range(6)]
    assert all(x["response"]["body"]["data"][0]["embedding"] for x in out)
    assert list(map(_normal, out)) == list(map(_normal, _job_submit(svc, src, tmp_path)))


def test_files_routes(svc: Service, alice: Any, tmp_path: Path) -> None:
    src = jsonl(tmp_path / "f.jsonl", [chat_line("x")])
    first = alice.files.create(file=src.open("rb"), purpose="batch")
    second = alice.files.create(file=("named.jsonl", src.read_bytes()), purpose="batch")
    assert (first.bytes, first.purpose, first.filename, first.status) == (len(src.read_bytes()), "batch", "f.jsonl",
                                                                          "processed")  # fmt: skip
    assert alice.files.retrieve(first.id) == first
    assert alice.files.content(first.id).read() == src.read_bytes()
    page = alice.files.list(purpose="batch", limit=1)
    assert [f.id for f in page.data] == [second.id] and page.has_more  # newest first
    older = alice.files.list(purpose="batch", limit=1, after=second.id)
    assert [f.id for f in older.data] == [first.id]
    assert [f.id for f in alice.files.list(purpose="batch", order="asc", after=first.id, limit=1).data] == [second.id]
    gone = alice.files.delete(first.id)
    assert gone.deleted and gone.id == first.id
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        alice.files.content(first.id)
    assert first.id not in [f.id for f in alice.files.list()]
    with pytest.raises(openai.BadRequestError, match="purpose"):
        alice.files.create(file=src.open("rb"), purpose="fine-tune")


BAD = {
    "bad-json": (['{"custom_id": "a", "method": "POST"', chat_line("b")], [("invalid_json_line", 1)]),
    "unknown-endpoint": ([chat_line("a"), {**chat_line("b"), "url": "/v1/images/generations"}], [("invalid_url", 2)]),
    "mixed-models": ([chat_line("a"), chat_line("b", model="other-model")], [("mismatched_model", 2)]),
    "duplicate-id": ([chat_line("a"), chat_line("b"), chat_line("a")], [("duplicate_custom_id", 3)]),
    "unknown-model": ([chat_line("a", model="no-such-model")], [("model_not_found", None)]),
    "no-body": ([{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}], [("invalid_request", 1)]),
    "get": ([{**chat_line("a"), "method": "GET"}], [("invalid_request", 1)]),
    "empty": (["", "  "], [("empty_file", None)]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_fail_with_openai_errors_and_send_nothing(svc: Service, alice: Any, tmp_path: Path, case) -> None:
    lines, want = BAD[case]
    before = _engine_requests(svc)
    upload = alice.files.create(file=jsonl(tmp_path / "bad.jsonl", lines).open("rb"), purpose="batch")
    batch = alice.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    got = [(e.code, e.line) for e in batch.errors.data]
    assert got == want, batch.errors
    assert all(e.message for e in batch.errors.data)
    assert alice.batches.retrieve(batch.id).status == "failed"
    assert _engine_requests(svc) == before  # nothing was sent


def test_request_arguments_are_checked(alice: Any, tmp_path: Path) -> None:
    upload = alice.files.create(file=jsonl(tmp_path / "ok.jsonl", [chat_line("a")]).open("rb"), purpose="batch")
    for kw, param in (
        ({"endpoint": "/v1/images/generations"}, "endpoint"),
        ({"completion_window": "forever"}, "completion_window"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"input_file_id": "file-nope"}, "input_file_id"),
    ):
        args = {"input_file_id": upload.id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **kw}
        with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as err:
            alice.batches.create(**args)
        assert err.value.body["param"] == param  # OpenAI's error shape


def test_limits_are_enforced_while_streaming(svc: Service, alice: Any, tmp_path: Path) -> None:
    files = svc.home / "batch-service" / "files"
    before = sorted(p.name for p in files.iterdir())
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (64 * 1024 + 1))
    with pytest.raises(openai.APIStatusError) as err:
        alice.files.create(file=big.open("rb"), purpose="batch")
    assert err.value.status_code == 413 and err.value.body["code"] == "file_too_large"
    many = jsonl(tmp_path / "many.jsonl", [chat_line(f"m{i}") for i in range(41)])
    with pytest.raises(openai.BadRequestError) as err:
        alice.files.create(file=many.open("rb"), purpose="batch")
    assert err.value.body["code"] == "too_many_requests"
    assert sorted(p.name for p in files.iterdir()) == before  # nothing of either upload stayed


def test_batches_list_pages_newest_first(svc: Service, tmp_path: Path) -> None:
    carol = svc.client(svc.key("carol"))
    upload = carol.files.create(file=jsonl(tmp_path / "e.jsonl", [""]).open("rb"), purpose="batch")
    made = [
        carol.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h").id
        for _ in range(3)
    ]
    page = carol.batches.list(limit=2)
    assert [b.id for b in page.data] == made[:0:-1] and page.has_more
    rest = carol.batches.list(limit=2, after=page.data[-1].id)
    assert [b.id for b in rest.data] == made[:1] and not rest.has_more
    assert [b.id for b in carol.batches.list()] == made[::-1]  # the SDK's auto-paging sees each once


def test_two_tenants_see_only_their_own(svc: Service, alice: Any, tmp_path: Path) -> None:
    key = svc.key("bob")
    bob = svc.client(key)
    src = jsonl(tmp_path / "a.jsonl", [chat_line("secret-prompt-1")])
    upload = alice.files.create(file=src.open("rb"), purpose="batch")
    batch = alice.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_batch(alice, batch.id)
    assert batch.status == "completed"
    assert upload.id not in [f.id for f in bob.files.list()] and batch.output_file_id not in [
        f.id for f in bob.files.list()
    ]
    assert batch.id not in [b.id for b in bob.batches.list()]
    for call in (
        lambda: bob.files.retrieve(upload.id),
        lambda: bob.files.content(upload.id),
        lambda: bob.files.content(batch.output_file_id),
        lambda: bob.files.delete(upload.id),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.batches.cancel(batch.id),
        lambda: bob.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert bob.files.list(after=upload.id).data == [] and bob.batches.list(after=batch.id).data == []
    assert alice.files.retrieve(upload.id).id == upload.id and alice.batches.retrieve(batch.id).status == "completed"
    files, batches = f"/files/{upload.id}", f"/batches/{batch.id}"
    routes = [("POST", "/files"), ("GET", "/files"), ("GET", files), ("GET", f"{files}/content"), ("DELETE", files),
              ("POST", "/batches"), ("GET", "/batches"), ("GET", batches), ("POST", f"{batches}/cancel")]  # fmt: skip
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer sk-batch-wrong"}, {"Authorization": key}):
            r = httpx.request(method, svc.url + path, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (method, path)
    assert alice.files.retrieve(upload.id).id == upload.id
    for secret in (key, "secret-prompt-1"):
        assert secret not in svc.log  # neither a key nor a prompt is logged
    db = (svc.home / "batch-service" / "service.db").read_bytes()
    assert key.encode() not in db  # only its hash is kept


def test_the_documented_client_runs(svc: Service) -> None:
    """examples/batch_service/client.py, as docs/batch-service.md shows it, against the service."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "examples" / "batch_service" / "client.py"
    env = {**os.environ, "OPENAI_BASE_URL": svc.url, "OPENAI_API_KEY": svc.key("docs")}
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("completed") and res.stdout.count("\nq") == 10


def test_the_example_config_loads() -> None:
    """examples/batch_service/service.yaml: its model served by examples/local-stub.yaml's swarm."""
    from prefect_swarm.batchserver.config import load_service

    loaded = load_service(Path(__file__).resolve().parents[2] / "examples" / "batch_service" / "service.yaml")
    assert loaded.swarms["stub-model"].name == "local-stub" and loaded.cfg.job == {"checkpoint_seconds": 10}
