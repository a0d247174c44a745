"""A batch's results as OpenAI hands them back: the output file and the error file.

The job writes every line of the batch, in input order, in OpenAI's output format
(:class:`prefect_swarm.jobs.rows.commit._JsonlWriter`); here it is split as OpenAI splits it: a line
answered with a 2xx goes to the output file, every other line (an HTTP error answer, a request that
failed, one never sent) to the error file. A batch stopped before its end (cancelled, expired, its
job gone for good) gets the lines its ledger holds as they were answered, and one error line for each
line that was not: ``batch_cancelled``, ``batch_expired`` or ``batch_failed``. So every input line is
in exactly one of the two files, whatever happened.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect_swarm.jobs.checkpoint.ledger import read_ledger, shard_store
from prefect_swarm.jobs.rows.commit import BATCH_COLUMNS, batch_line_result
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import atomic_file


@dataclass
class Split:
    """What a split wrote: line counts of each file and the token usage of the answers."""

    completed: int = 0
    failed: int = 0
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})

    def count_usage(self, body: Any) -> None:
        """Add the usage of one answer's body."""
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return
        prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        self.usage["input_tokens"] += prompt
        self.usage["output_tokens"] += completion
        self.usage["total_tokens"] += int(usage.get("total_tokens") or prompt + completion)

    def usage_object(self) -> dict[str, Any]:
        """The batch's ``usage`` as OpenAI shapes it."""
        return {
            **self.usage,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }


def succeeded(line: dict[str, Any]) -> bool:
    """A line for the output file: answered with a 2xx status."""
    response = line.get("response")
    return isinstance(response, dict) and 200 <= int(response.get("status_code") or 0) < 300


def split_lines(lines: Iterator[str], out_path: Path, err_path: Path) -> Split:
    """Write each OpenAI Batch output line to ``out_path`` or ``err_path`` (atomically); empty files are
    not left behind."""
    result = Split()
    with (
        atomic_file(out_path) as out_tmp,
        atomic_file(err_path) as err_tmp,
        open(out_tmp, "w", encoding="utf-8") as out,
        open(err_tmp, "w", encoding="utf-8") as err,
    ):
        for text in lines:
            if not text.strip():
                continue
            line = json.loads(text)
            if succeeded(line):
                result.completed += 1
                result.count_usage(line["response"].get("body"))
                out.write(text.rstrip("\n") + "\n")
            else:
                result.failed += 1
                err.write(text.rstrip("\n") + "\n")
    for path, n in ((out_path, result.completed), (err_path, result.failed)):
        if n == 0:
            path.unlink(missing_ok=True)
    return result


def committed_lines(committed: Path) -> Iterator[str]:
    """The lines of the job's committed output."""
    with committed.open(encoding="utf-8") as fh:
        yield from fh


def answered_lines(spec: JobSpec) -> dict[str, str]:
    """Each custom_id the job's ledger answered -> its output line (the latest answer of each)."""
    out: dict[str, str] = {}
    columns = ["_id", "status", "error", *BATCH_COLUMNS]
    for i in range(spec.shards):
        table = read_ledger(shard_store(spec, i), columns)
        if table is None:
            continue
        cols = {c: table.column(c).to_pylist() for c in columns}
        for k, cid in enumerate(cols["_id"]):  # in part order: a later answer replaces an earlier one
            response, error = batch_line_result(
                ok=cols["status"][k] == "ok",
                raw=cols[BATCH_COLUMNS[0]][k],
                http_status=int(cols["http_status"][k] or 0),
                attempts=int(cols["attempts"][k] or 0),
                error=cols["error"][k],
            )
            out[cid] = _line(cid, response, error)
    return out


def stopped_lines(spec: JobSpec | None, input_path: Path, code: str, message: str) -> Iterator[str]:
    """Every line of the batch's input, in order: its answer where the ledger has one, else an error
    line with ``code`` (``spec``: None when no job was ever started)."""
    answered = answered_lines(spec) if spec is not None else {}
    with input_path.open("rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            cid = json.loads(raw)["custom_id"]
            yield answered.get(cid) or _line(cid, None, {"code": code, "message": message})


def _line(cid: str, response: dict[str, Any] | None, error: dict[str, Any] | None) -> str:
    line = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": cid, "response": response, "error": error}
    return json.dumps(line, separators=(",", ":"))
