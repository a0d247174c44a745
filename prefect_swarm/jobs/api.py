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
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa

from prefect_swarm.exceptions import ConfigError

# a job's own code raises these about one row: public here, defined with every other error
from prefect_swarm.exceptions import InvalidAnswer as InvalidAnswer
from prefect_swarm.exceptions import RowRefused as RowRefused
from prefect_swarm.jobs.columns import RESERVED_COLUMNS

if TYPE_CHECKING:
    from prefect_swarm.jobs.structured import ResponseSchema

BUILTIN_JOBS: dict[str, str] = {
    "chat": "prefect_swarm.jobs.builtin:ChatCompletionJob",
    "completion": "prefect_swarm.jobs.builtin:CompletionJob",
    "embedding": "prefect_swarm.jobs.builtin:EmbeddingJob",
    "openai-batch": "prefect_swarm.jobs.builtin:OpenAIBatchJob",
}
"""Short names accepted wherever a ``module:Class`` job reference is."""

SamplesBy = Literal["auto", "n", "seeds"]
"""How several answers per row are asked for (:attr:`SwarmJob.samples_by`)."""

ColumnKind = str
"""What a job needs of an input column: ``string``, ``messages`` (list of {role, content} or a JSON
string of one), ``json`` (a struct/map or a JSON string), ``number`` or ``any``."""


class SwarmJob(abc.ABC):
    """Base class of every job. Subclasses set ``path`` and ``outputs`` and override the hooks.

    ``sampling`` (a dict merged into every request) and ``sampling_column`` (a column holding a
    per-row dict or JSON string, merged over it) are handled here for every subclass, and so is
    ``response_schema`` (structured output, :mod:`prefect_swarm.jobs.structured`) for jobs whose
    answers are text (an output ``text``): it is sent as ``response_format``, each answer is
    validated (refused answers are asked again up to ``schema_retries`` times) and the output gets
    one column per top-level field of the schema, plus ``schema_error``.
    """

    path: ClassVar[str] = "/v1/chat/completions"
    """Endpoint path the requests go to (below the base URL)."""
    outputs: Mapping[str, pa.DataType] = {}
    """Output columns this job adds, with their arrow types (an instance may extend them, e.g. with
    the fields of its response schema)."""
    answer_retries: int = 0
    """Times an answer refused with :class:`InvalidAnswer` is asked for again."""
    samples_by: SamplesBy = "n"
    """How a job asking for several answers per row gets them (see :meth:`sample_requests`): ``n``,
    one request with OpenAI's ``n``; ``seeds``, :meth:`sample_requests`; ``auto``, ``n`` until the
    engine answers with fewer choices (:class:`~prefect_swarm.exceptions.TooFewChoices`), then ``seeds``."""

    def __init__(
        self,
        sampling: Mapping[str, Any] | None = None,
        sampling_column: str | None = None,
        response_schema: str | None = None,
        schema_retries: int = 2,
    ) -> None:
        self.sampling: dict[str, Any] = dict(sampling or {})
        self.sampling_column = sampling_column
        self.response_schema: ResponseSchema | None = None
        self.response_format: dict[str, Any] | None = None
        if response_schema:
            self._use_schema(response_schema, schema_retries)

    def _use_schema(self, ref: str, retries: int) -> None:
        from prefect_swarm.jobs.structured import SCHEMA_ERROR_COLUMN, ResponseSchema

        name = type(self).__name__
        if "text" not in self.outputs:
            raise ConfigError(
                f"{name}: response_schema needs a job whose answers are text (an output 'text', as chat and "
                "completion have); this job's outputs are " + ", ".join(self.outputs) + "."
            )
        if retries < 0:
            raise ConfigError(f"{name}: schema_retries must be 0 or more (got {retries}).")
        schema = ResponseSchema.load(ref)
        check_reserved(f"response_schema {ref}: field", schema.fields, "Rename the field(s) in the schema.")
        clash = sorted(set(schema.fields) & {*self.outputs, SCHEMA_ERROR_COLUMN})
        if clash:
            raise ConfigError(
                f"response_schema {ref}: field(s) {', '.join(clash)} would collide with the job's output columns "
                f"of the same name ({', '.join(self.outputs)}, {SCHEMA_ERROR_COLUMN}). Rename the field(s)."
            )
        self.response_schema, self.response_format = schema, schema.response_format()
        self.answer_retries = retries
        self.outputs = {**self.outputs, **schema.fields, SCHEMA_ERROR_COLUMN: pa.string()}

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

    def rows(self, batch: pa.RecordBatch) -> list[dict[str, Any] | None]:
        """The rows of one input batch as dicts for :meth:`request`, in batch order; None for a row to
        drop before any request (it ends ``ok`` with null outputs). Default: every row as it is."""
        return batch.to_pylist()

    def finish_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One output batch before it is written (parquet output; default: as it is)."""
        return batch

    def parser(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """The function the runner applies to each 200 body (default :meth:`parse`); it may raise
        :class:`InvalidAnswer` to have the row asked again. Chosen once, so a plain job pays nothing."""
        return self.parse if self.response_schema is None else self._parse_structured

    def _parse_structured(self, body: dict[str, Any]) -> dict[str, Any]:
        """:meth:`parse`, then the answer text checked against the response schema (InvalidAnswer if not)."""
        assert self.response_schema is not None
        outputs = self.parse(body)
        outputs.update(self.response_schema.validate(outputs.get("text")))
        return outputs

    def sample_requests(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The requests sent instead of ``body`` when the answers are asked one request each (see
        :attr:`samples_by`); their answers are joined by :func:`join_choices` and parsed as one.
        Default: ``body`` alone (a job that asks for one answer per row)."""
        return [body]

    def after_invalid(self, outputs: dict[str, Any], error: str) -> dict[str, Any]:
        """Outputs of an answer accepted after refused ones (``error``: why the last one was refused)."""
        if self.response_schema is not None:
            from prefect_swarm.jobs.structured import SCHEMA_ERROR_COLUMN

            return {**outputs, SCHEMA_ERROR_COLUMN: error}
        return outputs

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
        if self.response_format is not None:
            body.setdefault("response_format", self.response_format)
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


def join_choices(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer holding the first choice of each of ``answers`` (the answers to
    :meth:`SwarmJob.sample_requests`), numbered in order, with their token counts summed (each
    request was prefilled and paid for)."""
    choices, prompt, completion = [], 0, 0
    for i, answer in enumerate(answers):
        first = (answer.get("choices") or [None])[0]
        if not isinstance(first, dict):
            raise InvalidAnswer(f"answer {i + 1} of {len(answers)} has no choice: {str(answer)[:200]}")
        choices.append({**first, "index": i})
        p, c = SwarmJob.usage(answer)
        prompt, completion = prompt + p, completion + c
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {**answers[0], "choices": choices, "usage": usage}


def check_reserved(what: str, names: Iterable[str], fix: str) -> None:
    """Refuse ``names`` that are the output's own columns (:data:`~prefect_swarm.jobs.columns.RESERVED_COLUMNS`):
    ConfigError ``"<what>(s) <clashing names> ..."`` with the reserved list and ``fix``."""
    clash = [n for n in names if n in RESERVED_COLUMNS]
    if clash:
        raise ConfigError(
            f"{what}(s) {', '.join(repr(n) for n in clash)} would clash with the output's own column(s) of that name: "
            f"{', '.join(RESERVED_COLUMNS)} are reserved for the job's results. {fix}"
        )


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
