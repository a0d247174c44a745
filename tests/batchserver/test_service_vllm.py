"""The batch service on a real vLLM (CPU build, tiny model, reached as an external swarm): a chat batch
(the suite's shared server) and an embeddings batch (a server of the same model run as an embedding
model: ``--runner pooling --convert embed``) through the openai SDK come back as `prefect-swarm job
submit --job openai-batch` writes them for the same lines; each line reaches its server once (vLLM's
own request counter)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import services
from service_kit import Service, jsonl, lines_of, wait_batch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
KEY_ENV = "BATCH_VLLM_KEY"


def _served(url: str) -> int:
    """Requests vLLM has finished (``vllm:request_success_total``)."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {services.VLLM_KEY}"}, timeout=10).text
    return round(sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\}\s+([0-9.e+]+)$", text, re.M)))


def _normal(line: dict[str, Any]) -> dict[str, Any]:
    """A line without what vLLM makes new for each request (ids, creation time)."""
    response = dict(line["response"] or {})
    response.pop("request_id", None)
    body = {k: v for k, v in (response.get("body") or {}).items() if k not in ("id", "created")}
    return {"custom_id": line["custom_id"], "error": line["error"], "response": {**response, "body": body}}


def _job_submit(svc: Service, name: str, src: Path) -> list[dict[str, Any]]:
    out = src.with_suffix(".out.jsonl")
    res = svc.cli("job", "submit", "-n", name, "--input", str(src), "--output", str(out), "--job",
                  "openai-batch", "--max-failed-fraction", "1", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return [json.loads(x) for x in out.read_text().splitlines()]


def _service(service_factory, url: str, name: str) -> Service:
    """A batch service whose model 'tiny' is the vLLM server at ``url``, its swarm brought up by a first batch."""
    swarm = {"name": name, "model": "tiny", "backend": {"type": "external", "url": url + "/v1",
                                                         "api_key_env": KEY_ENV}}  # fmt: skip
    return service_factory({"tiny": swarm}, env={KEY_ENV: services.VLLM_KEY}, idle_release_s=600)


@pytest.fixture(scope="module")
def chat_svc(service_factory, vllm_server: tuple[str, subprocess.Popen[bytes]]) -> tuple[Service, str]:
    url, _ = vllm_server
    return _service(service_factory, url, "svc-vllm"), url


@pytest.fixture(scope="module")
def embed_svc(service_factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    services.gate(services.missing_vllm())
    log = tmp_path_factory.mktemp("vllm-embed") / "vllm.log"
    args = ("--api-key", services.VLLM_KEY, "--runner", "pooling", "--convert", "embed")
    with services.vllm_server(log, *args) as (url, _):
        yield _service(service_factory, url, "svc-vllm-embed"), url


def _batch_as_job_submit_writes_it(svc: Service, url: str, name: str, tmp_path: Path, endpoint: str, body: Any) -> None:
    client = svc.client(svc.key("alice"))
    lines = [{"custom_id": f"v{i}", "method": "POST", "url": endpoint, "body": {"model": "tiny", **body(i)}}
             for i in range(6)]  # fmt: skip
    src = jsonl(tmp_path / "in.jsonl", lines)
    before = _served(url)
    upload = client.files.create(file=src.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h")
    batch = wait_batch(client, batch.id, timeout_s=600)
    assert batch.status == "completed" and batch.request_counts.total == 6 and batch.request_counts.failed == 0, (
        batch.errors
    )
    got = lines_of(client, batch.output_file_id)
    assert sorted(x["custom_id"] for x in got) == [f"v{i}" for i in range(6)]
    assert all(x["response"]["status_code"] == 200 for x in got), got
    assert _served(url) - before == 6 + 1  # each line once, and the readiness completion of the swarm's bring-up
    reference = _job_submit(svc, name, src)
    key = lambda x: x["custom_id"]  # noqa: E731
    assert [_normal(x) for x in sorted(got, key=key)] == [_normal(x) for x in sorted(reference, key=key)]


def test_a_chat_batch_on_vllm_as_job_submit_writes_it(chat_svc, tmp_path: Path) -> None:
    svc, url = chat_svc
    body = lambda i: {"messages": [{"role": "user", "content": f"Count to {i}"}], "max_tokens": 4, "temperature": 0}  # noqa: E731
    _batch_as_job_submit_writes_it(svc, url, "svc-vllm", tmp_path, "/v1/chat/completions", body)


def test_an_embeddings_batch_on_vllm_as_job_submit_writes_it(embed_svc, tmp_path: Path) -> None:
    svc, url = embed_svc
    _batch_as_job_submit_writes_it(
        svc, url, "svc-vllm-embed", tmp_path, "/v1/embeddings", lambda i: {"input": f"text number {i}"}
    )
