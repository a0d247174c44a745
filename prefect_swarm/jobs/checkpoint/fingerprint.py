"""The job fingerprint: what must not change for a checkpoint to be resumed.

Input identity (each file's path, size, mtime), job class and kwargs, model, the swarm's engine
fingerprint, the id column, the output format and a response schema's content. Runner knobs
(concurrency, retries, endpoints, timeouts) and commit-only choices (input/output columns) may
change between runs.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from prefect_swarm.jobs.rows.input import InputDataset, open_input
from prefect_swarm.jobs.spec import JobSpec


def fingerprint_details(spec: JobSpec, dataset: InputDataset | None = None) -> dict[str, Any]:
    """The fields the fingerprint hashes, by name (shown when a resume is refused)."""
    dataset = dataset or open_input(spec)  # kept metadata: a stat per file, no footer
    return {
        "input": dataset.identity(),
        "job": spec.job,
        "job_kwargs": spec.job_kwargs,
        "model": spec.model or os.environ.get("MODEL"),
        "swarm_fingerprint": spec.swarm_fingerprint,
        "id_column": spec.id_column,
        "output_format": spec.output_format,
        **_schema_details(spec),
    }


def _schema_details(spec: JobSpec) -> dict[str, Any]:
    """The response schema's content (not only its name): an edited schema must not resume a
    checkpoint whose answers were checked against the old one."""
    ref = (spec.job_kwargs or {}).get("response_schema")
    if not ref:
        return {}
    from prefect_swarm.jobs.structured import ResponseSchema

    return {"response_schema": hash_details(ResponseSchema.load(str(ref)).schema)}


def hash_details(details: dict[str, Any]) -> str:
    """Stable short hash of ``details``."""
    return hashlib.sha256(json.dumps(details, sort_keys=True, default=str).encode()).hexdigest()[:16]


def job_fingerprint(spec: JobSpec, dataset: InputDataset | None = None) -> str:
    """The job's fingerprint (16 hex chars)."""
    return hash_details(fingerprint_details(spec, dataset))


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """One line per field that differs: ``model: 'a' -> 'b'``."""
    lines = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            lines.append(f"  {key}: {_short(old.get(key))} -> {_short(new.get(key))}")
    return "\n".join(lines) or "  (shard layout)"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."
