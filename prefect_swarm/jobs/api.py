"""The job API: how a row becomes a request, and a response becomes output columns.

A job is a :class:`SwarmJob` subclass, referenced in a spec as ``module:Class`` with JSON
keyword arguments, and rebuilt inside each job process by :func:`load_job`::

    class Sentiment(SwarmJob):
        path = "/v1/chat/completions"
        outputs = {"label": pa.string()}

        def columns(self):
            return {"review": "string"}

        def request(self, row):
            return {"messages": [{"role": "user", "content": "Sentiment? " + row["review"]}],
                    **self.sampling}

        def parse(self, body):
            return {"label": body["choices"][0]["message"]["content"].strip()}

``request`` and ``parse`` run once per row on the hot path: keep them plain dict work.
"""

from __future__ import annotations

import abc
import importlib
import inspect
import json
from collections.abc import Mapping
from typing import Any, ClassVar

import pyarrow as pa

from prefect_swarm.exceptions import ConfigError

BUILTIN_JOBS: dict[str, str] = {
    "chat": "prefect_swarm.jobs.builtin:ChatCompletionJob",
    "completion": "prefect_swarm.jobs.builtin:CompletionJob",
    "embedding": "prefect_swarm.jobs.builtin:EmbeddingJob",
    "openai-batch": "prefect_swarm.jobs.builtin:OpenAIBatchJob",
}
"""Short names accepted wherever a ``module:Class`` job reference is."""

ColumnKind = str
"""What a job needs of an input column: ``string``, ``messages`` (list of {role, content} or a JSON
string of one), ``json`` (a struct/map or a JSON string), ``number`` or ``any``."""


class SwarmJob(abc.ABC):
    """Base class of every job. Subclasses set ``path`` and ``outputs`` and override the hooks.

    ``sampling`` (a dict merged into every request) and ``sampling_column`` (a column holding a
    per-row dict or JSON string, merged over it) are handled here for every subclass.
    """

    path: ClassVar[str] = "/v1/chat/completions"
    """Endpoint path the requests go to (below the base URL)."""
    outputs: ClassVar[Mapping[str, pa.DataType]] = {}
    """Output columns this job adds, with their arrow types."""

    def __init__(self, sampling: Mapping[str, Any] | None = None, sampling_column: str | None = None) -> None:
        self.sampling: dict[str, Any] = dict(sampling or {})
        self.sampling_column = sampling_column

    # ------------------------------------------------------------------ hooks
    def columns(self) -> dict[str, ColumnKind]:
        """Input columns every row needs, with the kind each must be (checked before any request)."""
        return {}

    @abc.abstractmethod
    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """The JSON body for ``row`` (``model`` is added by the runner when absent)."""

    @abc.abstractmethod
    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        """Output values (keys of ``outputs``) from a 200 response body."""

    def route(self, row: dict[str, Any]) -> str:
        """Endpoint path for ``row`` (default: :attr:`path`)."""
        return self.path

    # ------------------------------------------------------------------ shared
    def all_columns(self) -> dict[str, ColumnKind]:
        """Every input column the job reads (its own plus the sampling column)."""
        cols = dict(self.columns())
        if self.sampling_column:
            cols[self.sampling_column] = "json"
        return cols

    def body(self, row: dict[str, Any]) -> dict[str, Any]:
        """``request(row)`` with the row's sampling parameters merged in."""
        body = self.request(row)
        if self.sampling_column:
            extra = row.get(self.sampling_column)
            if isinstance(extra, str):
                extra = json.loads(extra) if extra.strip() else None
            if extra:
                body.update({k: v for k, v in extra.items() if v is not None})
        return body

    @staticmethod
    def usage(body: dict[str, Any]) -> tuple[int, int]:
        """(prompt_tokens, completion_tokens) from a response body."""
        usage = body.get("usage") or {}
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def load_job(ref: str, kwargs: Mapping[str, Any] | None = None) -> SwarmJob:
    """Build the job ``module:Class`` (or a built-in short name) with ``kwargs``.

    Raises ConfigError naming the reference when the module, class or arguments are wrong.
    """
    ref = BUILTIN_JOBS.get(ref, ref)
    module_name, _, cls_name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"job '{ref}': cannot import module '{module_name}' ({exc}). The module must be "
            "importable in the job process (installed, or on PYTHONPATH)."
        ) from exc
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, SwarmJob)):
        raise ConfigError(f"job '{ref}': '{cls_name}' is not a SwarmJob subclass in module '{module_name}'.")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ConfigError(f"job '{ref}': '{cls_name}' does not implement {missing} (a SwarmJob needs both).")
    try:
        return cls(**dict(kwargs or {}))
    except TypeError as exc:
        raise ConfigError(f"job '{ref}': bad job_kwargs {dict(kwargs or {})!r}: {exc}") from exc
