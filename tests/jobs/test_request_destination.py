"""Requests only ever go to the swarm: no input line, route or option makes a job contact another address.

Every case runs the job process's entry point against a stub engine (the swarm) while a second
loopback listener (:class:`_jobkit.ConnectionCounter`) counts each connection made to it: it must
see none. An OpenAI Batch line whose ``url`` is not one of the swarm's routes (an ``@host:port``
that would make the swarm's address user-info, an absolute URL, no leading slash, ``//``, ``..``),
whose ``method`` is not POST or whose ``custom_id`` is not a non-empty string is refused before any
request: exit 2, the line named, the input untouched. Below the job, the runner builds every URL on
the endpoint with the route as a path only, so a route a job class returns cannot name a host.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _jobkit import ConnectionCounter, requests, write_spec

from prefect_swarm.jobs.builtin import OpenAIBatchJob
from prefect_swarm.jobs.dispatch.runner import request_url
from prefect_swarm.jobs.rows.input import BATCH_URLS
from prefect_swarm.jobs.run import main as job_main
from prefect_swarm.paths import JobPaths


@pytest.fixture
def elsewhere() -> Iterator[ConnectionCounter]:
    """The other address: must receive no connection."""
    with ConnectionCounter() as counter:
        yield counter


def _line(i: int, **over: Any) -> dict[str, Any]:
    line = {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4},
    }
    return {k: v for k, v in {**line, **over}.items() if v is not ...}


def _batch_job(tmp_path: Path, lines: list[dict[str, Any]], endpoint: str) -> tuple[Path, Path]:
    """An OpenAI Batch input of ``lines`` and the spec of a chat job over it against ``endpoint``."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec = write_spec(
        tmp_path, input=str(src), output=str(tmp_path / "out.jsonl"), id_column=None, job="chat", endpoints=[endpoint]
    )
    return src, spec


def _files(root: Path, skip: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and skip not in p.parents
    }


# Each case: the bad line's fields (``{port}``: the other listener), then the parts of the message.
BAD_LINES: dict[str, tuple[Callable[[int], dict[str, Any]], list[str]]] = {
    "url-at-host": (lambda p: {"url": f"@127.0.0.1:{p}/v1/chat/completions"}, ["'url'", "names a host"]),
    "url-slash-at-host": (lambda p: {"url": f"/@127.0.0.1:{p}/v1/chat/completions"}, ["'url'", "names a host"]),
    "url-absolute": (
        lambda p: {"url": f"http://127.0.0.1:{p}/v1/chat/completions"},
        ["'url'", "names a host (an absolute URL"],
    ),
    "url-no-slash": (lambda p: {"url": f"127.0.0.1:{p}/v1/chat/completions"}, ["'url'", "does not start with '/'"]),
    "url-no-slash-route": (lambda p: {"url": "v1/chat/completions"}, ["'url'", "does not start with '/'"]),
    "url-double-slash": (lambda p: {"url": f"//127.0.0.1:{p}/v1/chat/completions"}, ["'url'", "not a plain path"]),
    "url-dot-dot": (lambda p: {"url": "/v1/chat/../../v1/chat/completions"}, ["'url'", "not a plain path"]),
    "url-query": (lambda p: {"url": "/v1/chat/completions?x=1"}, ["'url'", "not a plain path"]),
    "url-other-route": (lambda p: {"url": "/v1/models"}, ["'url' \"/v1/models\"", "not a route the swarm serves"]),
    "url-null": (lambda p: {"url": None}, ["'url' null is not a path"]),
    "method-get": (lambda p: {"method": "GET"}, ["'method' \"GET\" is not supported", '"method": "POST"']),
    "method-null": (lambda p: {"method": None}, ["'method' null is not supported"]),
    "custom-id-null": (lambda p: {"custom_id": None}, ["'custom_id' must be a non-empty string (got null)"]),
    "custom-id-empty": (lambda p: {"custom_id": ""}, ["'custom_id' must be a non-empty string"]),
    "custom-id-number": (lambda p: {"custom_id": 7}, ["'custom_id' must be a non-empty string (got int 7)"]),
}


@pytest.mark.parametrize("name", list(BAD_LINES))
def test_bad_batch_line_is_refused_before_any_request(
    tmp_path: Path, stub, elsewhere: ConnectionCounter, caplog, own_signals, name: str
) -> None:
    """Line 3 of 5 is bad: exit 2 naming the file, the line and the field; nothing sent anywhere."""
    fields, expect = BAD_LINES[name]
    lines = [_line(i) for i in range(5)]
    lines[2] = _line(2, **fields(elsewhere.port))
    src, spec = _batch_job(tmp_path, lines, stub.url)
    before_files, before = _files(tmp_path, tmp_path / "job"), requests(stub)
    caplog.set_level(logging.ERROR, logger="prefect_swarm.jobs")
    code = job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"])
    assert code == 2, caplog.text
    assert f"input {src} line 3: " in caplog.text
    for part in expect:
        assert part in caplog.text, caplog.text
    assert requests(stub) == before
    assert elsewhere.connections == 0
    assert _files(tmp_path, tmp_path / "job") == before_files  # input bytes unchanged, no output, no temp file
    assert not JobPaths(tmp_path / "job").shard(0).parts()


def test_good_batch_lines_on_every_route_are_sent(tmp_path: Path, stub, elsewhere: ConnectionCounter) -> None:
    """The check refuses only what is wrong: each accepted url (and a line without url or method) is sent."""
    lines = [_line(i, url=url) for i, url in enumerate(BATCH_URLS)]
    lines[2]["body"] = {"input": "embed me"}
    lines.append(_line(9, url=..., method=...))
    lines.append(_line(10, method="post"))
    _, spec = _batch_job(tmp_path, lines, stub.url)
    before = requests(stub)
    assert job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"]) == 0
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    assert all(o["response"]["status_code"] == 200 for o in out), out
    assert requests(stub) - before == len(lines)
    assert elsewhere.connections == 0


def test_parquet_rows_with_a_bad_url_are_error_rows_without_a_request(
    tmp_path: Path, stub, elsewhere: ConnectionCounter, own_signals
) -> None:
    """The openai-batch job on a parquet input (url and body columns): a bad url is an error row, never sent."""
    p = elsewhere.port
    urls = ["/v1/chat/completions", f"@127.0.0.1:{p}/v1/chat/completions", f"http://127.0.0.1:{p}/x", "/v1/models"]
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    pq.write_table(
        pa.table({"id": ["a", "b", "c", "d"], "url": urls, "body": [body] * 4}),
        tmp_path / "in.parquet",
    )
    spec = write_spec(tmp_path, endpoints=[stub.url], job="openai-batch", job_kwargs={})
    before = requests(stub)
    assert job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"]) == 0
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "job-out.parquet").to_pylist()}
    assert rows["a"]["status"] == "ok"
    assert "names a host" in rows["b"]["error"] and "names a host" in rows["c"]["error"]
    assert "not a route the swarm serves" in rows["d"]["error"]
    assert all(rows[k]["status"] == "error" for k in "bcd")
    assert requests(stub) - before == 1
    assert elsewhere.connections == 0


class RouteJob(OpenAIBatchJob):
    """A job class whose route is whatever the row's ``url`` says, unchecked (the runner's guard alone)."""

    def route(self, row: dict[str, Any]) -> str:
        return str(row["url"])


def test_runner_keeps_every_request_on_the_endpoint_whatever_the_route(
    tmp_path: Path, stub, elsewhere: ConnectionCounter, own_signals
) -> None:
    """Routes naming another host reach the swarm's endpoint as paths (a 404 there), never the other host."""
    p = elsewhere.port
    urls = [
        f"@127.0.0.1:{p}/v1/chat/completions",
        f"http://127.0.0.1:{p}/v1/chat/completions",
        f"//127.0.0.1:{p}/v1/chat/completions",
        f"127.0.0.1:{p}/v1/chat/completions",
        "/v1/chat/completions",
    ]
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    pq.write_table(pa.table({"id": list("abcde"), "url": urls, "body": [body] * 5}), tmp_path / "in.parquet")
    module = sys.modules[__name__].__name__
    spec = write_spec(tmp_path, endpoints=[stub.url], job=f"{module}:RouteJob", job_kwargs={}, max_retries=0)
    assert job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"]) == 0
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "job-out.parquet").to_pylist()}
    assert rows["e"]["status"] == "ok"
    assert all(rows[k]["error"].startswith("HTTP 404") for k in "abcd"), rows  # answered by the stub: the swarm's host
    assert elsewhere.connections == 0


@pytest.mark.parametrize(
    "route",
    ["@10.0.0.1:9/v1/chat/completions", "http://10.0.0.1:9/x", "//10.0.0.1:9/x", "10.0.0.1:9/x", "/../../x", "/a?b#c"],
)
@pytest.mark.parametrize(
    "base", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "https://host.example:8443/prefix"]
)
def test_request_url_never_changes_the_authority(base: str, route: str) -> None:
    url, origin = request_url(base, route), request_url(base, "/v1/chat/completions")
    assert (url.scheme, url.host, url.port, url.user, url.password) == (
        origin.scheme,
        origin.host,
        origin.port,
        None,
        None,
    )
    assert url.query_string == "" and url.fragment == ""
    assert str(origin) == base.rstrip("/") + "/v1/chat/completions"
