"""A batch input file checked as OpenAI checks it before running anything.

Every line is read (the file is already within the upload limits); each problem becomes one entry of
the batch's ``errors`` (``{code, message, param, line}``, ``line`` from 1, as OpenAI returns them),
at most :data:`MAX_ERRORS` of them. A batch with any error is ``failed`` and sends no request.

Codes: ``empty_file``, ``invalid_json_line``, ``invalid_request`` (not an object, no ``custom_id``
string, no ``body`` object, a method other than POST), ``invalid_url`` (not the batch's
endpoint), ``missing_model``, ``mismatched_model`` (every line of a batch names one model),
``model_not_found`` (no swarm serves it here), ``duplicate_custom_id``, ``too_many_requests``
(over the service's ``max_requests``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect_swarm.jobs.rows.input import BATCH_URLS, batch_method_problem

MAX_ERRORS = 100
"""Most errors listed for one file (the first ones, in line order)."""


@dataclass
class Checked:
    """What the check found: the model every line names, the number of requests, the errors."""

    model: str | None = None
    total: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)

    def add(self, code: str, message: str, line: int | None, param: str | None = None) -> None:
        """Add one error (past MAX_ERRORS they are counted, not listed)."""
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})


def check_input(path: Path, endpoint: str, models: set[str], max_requests: int) -> Checked:
    """Check every line of the batch input file at ``path`` for a batch to ``endpoint``."""
    out = Checked()
    seen: set[str] = set()
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            out.total += 1
            if out.total == max_requests + 1:
                out.add(
                    "too_many_requests",
                    f"The batch has more than {max_requests} requests, the most this service runs in one batch. "
                    "Split the file into several batches.",
                    lineno,
                )
            _check_line(raw, lineno, endpoint, out, seen)
    if out.total == 0:
        out.add("empty_file", "The input file has no request lines.", None)
    elif (
        out.model is not None and out.model not in models and not any(e["code"] == "missing_model" for e in out.errors)
    ):
        served = ", ".join(sorted(models)) or "none"
        out.add(
            "model_not_found",
            f"The model '{out.model}' is not served by this batch service (served: {served}).",
            None,
            "body.model",
        )
    return out


def _check_line(raw: bytes, lineno: int, endpoint: str, out: Checked, seen: set[str]) -> None:
    try:
        rec = json.loads(raw)
    except ValueError:
        out.add("invalid_json_line", "This line is not parseable as valid JSON.", lineno)
        return
    if not isinstance(rec, dict):
        out.add("invalid_request", "A batch line must be a JSON object.", lineno)
        return
    cid = rec.get("custom_id")
    if not isinstance(cid, str) or not cid.strip():
        out.add("invalid_request", "'custom_id' must be a non-empty string.", lineno, "custom_id")
    elif cid in seen:
        out.add(
            "duplicate_custom_id", f"The custom_id '{_short(cid)}' is used by an earlier line.", lineno, "custom_id"
        )
    else:
        seen.add(cid)
    problem = batch_method_problem(rec.get("method"))
    if problem:
        out.add("invalid_request", problem, lineno, "method")
    if rec.get("url") != endpoint:
        out.add(
            "invalid_url",
            f"The url {_short(rec.get('url'))} of this line does not match the batch's endpoint '{endpoint}'.",
            lineno,
            "url",
        )
    body = rec.get("body")
    if not isinstance(body, dict):
        out.add("invalid_request", "'body' must be a JSON object (the request sent to the endpoint).", lineno, "body")
        return
    _check_model(body.get("model"), lineno, out)


def _check_model(model: object, lineno: int, out: Checked) -> None:
    if not isinstance(model, str) or not model:
        out.add("missing_model", "The line's body has no 'model'.", lineno, "body.model")
    elif out.model is None:
        out.model = model
    elif model != out.model:
        out.add(
            "mismatched_model",
            f"The model '{_short(model)}' differs from '{_short(out.model)}' of the earlier lines: "
            "a batch runs one model.",
            lineno,
            "body.model",
        )


def endpoint_problem(endpoint: object) -> str | None:
    """Why ``endpoint`` cannot be a batch's endpoint (None: it can)."""
    if endpoint in BATCH_URLS:
        return None
    return f"Invalid value for 'endpoint': {_short(endpoint)}. Supported: {', '.join(BATCH_URLS)}."


def _short(value: object, n: int = 64) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= n else text[: n - 3] + "..."
