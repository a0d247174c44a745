"""The output's own columns: the bookkeeping each finished row carries beside the job's outputs.

The ledger writes them (:mod:`prefect_swarm.jobs.checkpoint.ledger`); the job API refuses an output,
a response schema field or a kept input column that would clash with one
(:func:`prefect_swarm.jobs.api.check_reserved`).
"""

from __future__ import annotations

import pyarrow as pa

BASE_FIELDS: list[tuple[str, pa.DataType]] = [
    ("_row", pa.int64()),
    ("_id", pa.string()),
    ("status", pa.string()),
    ("error", pa.string()),
    ("http_status", pa.int16()),
    ("prompt_tokens", pa.int64()),
    ("completion_tokens", pa.int64()),
    ("latency_ms", pa.float32()),
    ("attempts", pa.int16()),
]
RAW_COLUMN = "_response"
"""Ledger column of the raw response body (kept for the OpenAI Batch output)."""
RESERVED_COLUMNS: tuple[str, ...] = (*(name for name, _ in BASE_FIELDS), RAW_COLUMN)
"""Names the ledger and the output own: no job output, response schema field or kept input column may
use one (refused before any request, with this list)."""
