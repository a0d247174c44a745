"""Why a job's rows failed: the top reasons with their counts and a few example rows.

A failed row's ``error`` is the engine's own words (``HTTP 503: {"object": "error", ...}``), or what
the runner saw (``timeout after 60s``, ``connection error: ...``), prefixed by the retries
(``gave up after 4 attempts; last: ...``) and followed by the earlier runs' reasons
(``... | earlier: ...``). :func:`reason_of` keeps the kind (``HTTP 503``), :func:`failure_summary`
counts the kinds over a failed-rows file (JSONL: id, error) and keeps one example row per kind: its
id, its kind and its newest error, shortened and redacted (:func:`prefect_swarm.redaction.redact`).
An error holds what the engine answered, never the row's prompt.

The commit stores the summary in the job's manifest (``failure_reasons``), so the run's state
message, its ``failed-rows`` artifact, the ``job.failed`` event and ``job status`` show the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prefect_swarm.jobs.checkpoint.ledger import EARLIER_ERRORS
from prefect_swarm.redaction import redact

TOP_REASONS = 5
"""Reasons shown by count; the rest are summed as ``other``."""

EXAMPLES = 3
"""Example rows shown (one per reason, the most frequent first)."""

WORDS_CHARS = 200
"""An example's error is cut to this many characters."""

MAX_KINDS = 100
"""Distinct reasons counted one by one; past it a new reason counts as ``other``."""

OTHER = "other"

_GAVE_UP = re.compile(r"^gave up after \d+ attempts?; last: ")
_ANSWER_OF = re.compile(r"^answer \d+ of \d+: ")
_HTTP = re.compile(r"^HTTP \d{3}(?: answer [a-z -]+)?")
_TIMEOUT = re.compile(r"^timeout after [0-9.]+s")
_CONNECTION = re.compile(r"^connection error: [A-Za-z_.]+")
_INVALID = re.compile(r"^answer still invalid after \d+ tries")


def newest_error(error: str) -> str:
    """The newest run's error of a row (the earlier runs' reasons dropped)."""
    return error.split(EARLIER_ERRORS, 1)[0].strip()


def reason_of(error: str | None) -> str:
    """The kind of a row's error, e.g. ``HTTP 503``, ``timeout after 60s``, ``connection error: ClientOSError``."""
    text = newest_error(error or "") or "error"
    text = _GAVE_UP.sub("", text)
    text = _ANSWER_OF.sub("", text)
    for pattern in (_HTTP, _TIMEOUT, _CONNECTION):
        if m := pattern.match(text):
            return m.group(0)
    if _INVALID.match(text):
        return "answer invalid for the response schema"
    return text.split(":", 1)[0].strip()[:80] or "error"


def words(error: str | None, secrets: Iterable[str] = ()) -> str:
    """A row's newest error as shown (without the retries' prefix): redacted, cut to :data:`WORDS_CHARS`."""
    text = redact(_GAVE_UP.sub("", newest_error(error or "")), secrets)
    return text if len(text) <= WORDS_CHARS else text[: WORDS_CHARS - 3] + "..."


class FailureTally:
    """Counts failed rows by reason; keeps the first row of each reason as its example."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, dict[str, Any]] = {}

    def add(self, row_id: Any, error: str | None) -> None:
        reason = reason_of(error)
        if reason not in self.counts and len(self.counts) >= MAX_KINDS:
            reason = OTHER
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if reason not in self.first:
            self.first[reason] = {"id": str(row_id), "reason": reason, "error": words(error)}

    def summary(self) -> dict[str, Any]:
        """``{rows, reasons: [{reason, rows, example_id, example_error}], other_rows, examples: [{id,
        reason, error}]}``: the :data:`TOP_REASONS` most frequent reasons, each with its first row."""
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        top = ranked[:TOP_REASONS]
        return {
            "rows": sum(self.counts.values()),
            "reasons": [
                {"reason": r, "rows": n, "example_id": self.first[r]["id"], "example_error": self.first[r]["error"]}
                for r, n in top
            ],
            "other_rows": sum(n for _, n in ranked[TOP_REASONS:]),
            "examples": [self.first[r] for r, _ in ranked[:EXAMPLES]],
        }


def failure_summary(failed_rows: str | Path) -> dict[str, Any] | None:
    """The summary of a failed-rows file (JSONL: id, error); None when it is missing or empty."""
    path = Path(failed_rows)
    if not path.is_file():
        return None
    tally = FailureTally()
    with path.open() as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                tally.add(row.get("id"), row.get("error"))
    return tally.summary() if tally.counts else None


def reasons_line(summary: dict[str, Any] | None) -> str:
    """``Why: HTTP 500 x155, HTTP 503 x126 (and 3 other rows).``; '' without failed rows."""
    if not summary or not summary.get("reasons"):
        return ""
    shown = ", ".join(f"{r['reason']} x{r['rows']}" for r in summary["reasons"])
    other = f" (and {summary['other_rows']} rows for other reasons)" if summary.get("other_rows") else ""
    return f"Why: {shown}{other}."


def failure_lines(summary: dict[str, Any] | None, secrets: Iterable[str] = ()) -> list[str]:
    """The reasons line, then one line per example row (``row 17: HTTP 500: {...}``), redacted with
    ``secrets`` too; [] without failed rows."""
    head = reasons_line(summary)
    if not head or summary is None:
        return []
    secrets = list(secrets)
    return [head, *(f"  row {e['id']}: {words(e['error'], secrets)}" for e in summary.get("examples") or [])]


def manifest_failures(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """A committed manifest's failure summary (read from its failed-rows file for a manifest written
    before the commit stored it); None when no row failed."""
    if not manifest or not int(manifest.get("failed") or 0):
        return None
    if manifest.get("failure_reasons"):
        return dict(manifest["failure_reasons"])
    return failure_summary(manifest["failed_rows"]) if manifest.get("failed_rows") else None
