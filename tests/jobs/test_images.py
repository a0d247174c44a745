"""Images in chat rows: multimodal messages as OpenAI shapes them; a bad image is an error row, never sent."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _jobkit import requests, run_job, write_spec

from prefect_swarm.jobs.images import MAX_IMAGE_BYTES, MAX_IMAGES_PER_ROW

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
JPEG = b"\xff\xd8\xff\xe0" + b"\x01" * 24


def _run(tmp: Path, stub, table: pa.Table, **kwargs) -> list[dict]:
    pq.write_table(table, tmp / "in.parquet")
    job_kwargs = {"sampling": {"max_tokens": 8}, **kwargs}
    spec = write_spec(tmp, endpoints=[stub.url], job_kwargs=job_kwargs, max_failed_fraction=1.0)
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    return pq.read_table(tmp / "job-out.parquet").to_pylist()


def test_binary_image_column_becomes_a_data_url(tmp_path: Path, stub) -> None:
    table = pa.table(
        {
            "id": ["png", "jpeg", "garbage", "empty", "huge"],
            "prompt": ["what is this?"] * 5,
            "image": pa.array(
                [PNG, JPEG, b"not an image", b"", PNG.ljust(MAX_IMAGE_BYTES + 1, b"\0")], type=pa.binary()
            ),
        }
    )
    before = requests(stub)
    rows = {r["id"]: r for r in _run(tmp_path, stub, table, image_column="image")}
    assert requests(stub) - before == 2  # the bad images were never sent
    for rid in ("png", "jpeg"):
        assert rows[rid]["status"] == "ok" and rows[rid]["text"].endswith("images=1"), rows[rid]
    assert "no known format" in rows["garbage"]["error"] and "image_mime" in rows["garbage"]["error"]
    assert "the image is empty" in rows["empty"]["error"]
    assert f"more than the {MAX_IMAGE_BYTES:,} one row may send" in rows["huge"]["error"]
    assert rows["png"]["image"] == PNG  # input columns kept as they are


def _message(*parts: dict) -> str:
    return json.dumps([{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}])


def _image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_messages_with_image_parts(tmp_path: Path, stub) -> None:
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    cases = {
        "http": _message(_image("https://example.com/cat.png")),
        "data-url": _message(_image(data_url), _image("http://example.com/dog.jpg")),
        "file-path": _message(_image("file:///etc/passwd")),
        "bad-base64": _message(_image("data:image/png;base64,@@@not-base64")),
        "not-image": _message(_image("data:text/plain;base64,aGk=")),
        "bad-part": _message({"type": "audio", "audio": "x"}),
        "too-many": _message(*[_image(f"https://example.com/{i}.png") for i in range(MAX_IMAGES_PER_ROW + 1)]),
        "too-big": _message(_image("data:image/png;base64," + base64.b64encode(bytes(MAX_IMAGE_BYTES + 1)).decode())),
    }
    table = pa.table({"id": list(cases), "messages": list(cases.values())})
    before = requests(stub)
    rows = {r["id"]: r for r in _run(tmp_path, stub, table, messages_column="messages")}
    assert requests(stub) - before == 2
    assert rows["http"]["status"] == "ok" and rows["http"]["text"].endswith("images=1")
    assert rows["data-url"]["status"] == "ok" and rows["data-url"]["text"].endswith("images=2")
    assert "neither http(s) nor a data URL" in rows["file-path"]["error"]
    assert "messages[0].content[1]" in rows["bad-base64"]["error"] and "base64" in rows["bad-base64"]["error"]
    assert "data:image/<type>;base64" in rows["not-image"]["error"]
    assert "must be 'text' or 'image_url'" in rows["bad-part"]["error"]
    assert f"holds {MAX_IMAGES_PER_ROW + 1} images, more than the {MAX_IMAGES_PER_ROW}" in rows["too-many"]["error"]
    assert "messages[0].content[1]" in rows["too-big"]["error"] and "one row may send" in rows["too-big"]["error"]
