"""Where output goes: results on stdout (JSON for machines, tables for people), logs on stderr.

JSON documents carry a top-level ``schema_version``; fields are only ever added under one
version, never renamed or removed.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

JSON_SCHEMA_VERSION = 1
"""Version of every JSON document the CLI prints."""

console = Console(highlight=False, soft_wrap=True)
"""stdout: command results."""

err_console = Console(stderr=True, highlight=False)
"""stderr: logs, progress, prompts, errors."""


class OutputFormat(enum.StrEnum):
    """``-o`` choices."""

    table = "table"
    json = "json"


def setup_logging(level: str) -> None:
    """Send log records to stderr through rich."""
    handler = RichHandler(console=err_console, show_path=False, show_time=False, markup=False)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet = logging.WARNING if root.level > logging.DEBUG else logging.DEBUG
    for chatty in ("httpx", "httpcore"):  # one line per readiness probe is noise, except when debugging
        logging.getLogger(chatty).setLevel(quiet)


def iso(ts: float | None) -> str | None:
    """Epoch seconds as an ISO 8601 UTC string."""
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="seconds")


def emit_json(doc: Mapping[str, Any]) -> None:
    """Print ``doc`` with ``schema_version`` first, as one JSON document on stdout."""
    body = {"schema_version": JSON_SCHEMA_VERSION, **{k: v for k, v in doc.items() if k != "schema_version"}}
    sys.stdout.write(json.dumps(body, indent=2, default=str) + "\n")
    sys.stdout.flush()


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich table with string cells (None shows as '-')."""
    out = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        out.add_column(col, overflow="fold")
    for row in rows:
        out.add_row(*("-" if v is None else str(v) for v in row))
    return out
