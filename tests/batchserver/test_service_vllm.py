"""The batch service on a real vLLM (CPU build, tiny model; the suite's shared server, reached as an
external swarm): a chat batch and an embeddings batch through the openai SDK come back as
`prefect-swarm job submit --job openai-batch` writes them for the same lines; each chat line reaches
the server once (vLLM's own request counter). That server runs a generative model, which serves no
``/v1/embeddings``: each embeddings line comes back in the error file with vLLM's 404, as from job
submit (the stub engine's embeddings are answered: tests/batchserver/test_service.py)."""

from __future__ import annotations

import json
import re
import subprocess
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


def _job_submit(svc: Service, src: Path) -> list[dict[str, Any]]:
    out = src.with_suffix(".out.jsonl")
    res = svc.cli("job", "submit", "-n", "svc-vllm", "--input", str(src), "--output", str(out), "--job",
                  "openai-batch", "--max-failed-fraction", "1", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return [json.loads(x) for x in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def vllm_svc(service_factory, vllm_server: tuple[str, subprocess.Popen[bytes]]) -> tuple[Service, str]:
    url, _ = vllm_server
    swarm = {"name": "svc-vllm", "model": "tiny", "backend": {"type": "external", "url": url + "/v1",
                                                               "api_key_env": KEY_ENV}}  # fmt: skip
    svc = service_factory({"tiny": swarm}, env={KEY_ENV: services.VLLM_KEY}, idle_release_s=600)
    client = svc.client(svc.key("warm"))  # a first batch brings the swarm up (its readiness sends one request)
    line = {"custom_id": "w", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}  # fmt: skip
    upload = client.files.create(file=jsonl(svc.home / "warm.jsonl", [line]).open("rb"), purpose="batch")
    warm = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_batch(client, warm.id, timeout_s=600).status == "completed"
    return svc, url


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (
            "/v1/chat/completions",
            lambda i: {"messages": [{"role": "user", "content": f"Count to {i}"}], "max_tokens": 4, "temperature": 0},
        ),
        ("/v1/embeddings", lambda i: {"input": f"text number {i}"}),
    ],
    ids=["chat", "embeddings"],
)
def test_a_batch_on_vllm_as_job_submit_writes_it(vllm_svc, tmp_path: Path, endpoint: str, body: Any) -> None:
    svc, url = vllm_svc
    client = svc.client(svc.key("alice"))
    lines = [{"custom_id": f"v{i}", "method": "POST", "url": endpoint, "body": {"model": "tiny", **body(i)}}
             for i in range(6)]  # fmt: skip
    src = jsonl(tmp_path / "in.jsonl", lines)
    before = _served(url)
    upload = client.files.create(file=src.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h")
    batch = wait_batch(client, batch.id, timeout_s=600)
    assert batch.status == "completed" and batch.request_counts.total == 6
    answered = lines_of(client, batch.output_file_id)
    got = answered + lines_of(client, batch.error_file_id)
    assert sorted(x["custom_id"] for x in got) == [f"v{i}" for i in range(6)]
    if endpoint == "/v1/chat/completions":
        assert len(answered) == 6 and _served(url) - before == 6  # each line reached vLLM once
    else:  # the suite's vLLM runs a generative model: it has no embeddings route, and says so with a 404
        assert not answered and all(x["response"]["status_code"] == 404 for x in got)
    reference = _job_submit(svc, src)
    key = lambda x: x["custom_id"]  # noqa: E731
    assert [_normal(x) for x in sorted(got, key=key)] == [_normal(x) for x in sorted(reference, key=key)]
