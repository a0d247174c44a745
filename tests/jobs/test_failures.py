"""Why rows failed (``prefect_swarm.jobs.checkpoint.failures``): each error's kind, the top kinds by count, one
example row per kind with the engine's words, redacted and short."""

from __future__ import annotations

import json
from pathlib import Path

from prefect_swarm.jobs.checkpoint.failures import (
    EXAMPLES,
    TOP_REASONS,
    WORDS_CHARS,
    failure_lines,
    failure_summary,
    manifest_failures,
    reason_of,
)
from prefect_swarm.jobs.checkpoint.ledger import EARLIER_ERRORS


def test_each_error_is_counted_by_its_kind() -> None:
    assert reason_of('gave up after 4 attempts; last: HTTP 503: {"error": "busy"}') == "HTTP 503"
    assert reason_of("HTTP 400: {}" + EARLIER_ERRORS + "HTTP 500: {}") == "HTTP 400"  # the newest run's
    assert reason_of("timeout after 60s") == "timeout after 60s"
    cut = "HTTP 200 answer cut short"
    assert reason_of(f"{cut}: connection error: ClientPayloadError: x") == cut
    assert reason_of("connection error: ClientConnectorError: Cannot connect to host") == (
        "connection error: ClientConnectorError"
    )
    assert reason_of("answer 2 of 4: HTTP 500: {}") == "HTTP 500"
    assert reason_of("answer still invalid after 3 tries: 'x' is a required property") == (
        "answer invalid for the response schema"
    )
    assert reason_of("prompt column 'prompt' is null") == "prompt column 'prompt' is null"
    assert reason_of(None) == "error"


def _failed(path: Path, errors: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "error": e}) + "\n" for i, e in enumerate(errors)))
    return path


def test_the_summary_ranks_reasons_and_shows_one_example_row_each(tmp_path: Path) -> None:
    errors = ["HTTP 500: a"] * 5 + ["HTTP 503: b"] * 7 + [f"odd {i}: x" for i in range(TOP_REASONS)]
    summary = failure_summary(_failed(tmp_path / "failed.jsonl", errors))
    assert summary is not None and summary["rows"] == len(errors)
    assert [(r["reason"], r["rows"]) for r in summary["reasons"][:2]] == [("HTTP 503", 7), ("HTTP 500", 5)]
    assert len(summary["reasons"]) == TOP_REASONS and summary["other_rows"] == 2
    assert [e["id"] for e in summary["examples"]] == ["r5", "r0", "r12"][:EXAMPLES]
    lines = failure_lines(summary)
    assert lines[0] == "Why: HTTP 503 x7, HTTP 500 x5, odd 0 x1, odd 1 x1, odd 2 x1 (and 2 rows for other reasons)."
    assert lines[1] == "  row r5: HTTP 503: b" and len(lines) == 1 + EXAMPLES


def test_the_engines_words_are_redacted_and_short(tmp_path: Path) -> None:
    key = "sk-swarm-key-123456"
    long = "x" * 1000
    errors = [f"HTTP 401: bad key {key}; Authorization: Bearer abcdefgh", f"HTTP 500: {long}"]
    summary = failure_summary(_failed(tmp_path / "failed.jsonl", errors))
    text = "\n".join(failure_lines(summary, secrets=[key]))
    assert key not in text and "abcdefgh" not in text and "***" in text, text
    assert all(len(line) < WORDS_CHARS + 20 for line in text.splitlines()), text


def test_a_manifest_without_the_summary_reads_its_failed_rows_file(tmp_path: Path) -> None:
    path = _failed(tmp_path / "failed.jsonl", ["HTTP 500: a"])
    assert manifest_failures({"failed": 0, "failed_rows": str(path)}) is None
    got = manifest_failures({"failed": 1, "failed_rows": str(path)})
    assert got is not None and got["reasons"][0]["reason"] == "HTTP 500"
    stored = {"failed": 1, "failed_rows": str(path), "failure_reasons": {"rows": 1, "reasons": []}}
    assert manifest_failures(stored) == {"rows": 1, "reasons": []}
