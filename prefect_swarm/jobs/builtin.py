"""Built-in jobs: chat completions, completions, embeddings, and OpenAI Batch lines as they are."""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from typing import Any, get_args

import pyarrow as pa

from prefect_swarm.exceptions import ConfigError, RowRefused, TooFewChoices
from prefect_swarm.jobs.api import SamplesBy, SwarmJob
from prefect_swarm.jobs.images import check_messages, image_part
from prefect_swarm.jobs.rows.input import batch_url_problem
from prefect_swarm.jobs.template import PromptTemplate

_TEXT_OUTPUTS = {"text": pa.string(), "finish_reason": pa.string()}
_SAMPLE_OUTPUTS = {"text": pa.list_(pa.string()), "finish_reason": pa.list_(pa.string())}


MAX_SAMPLES = 128
"""The most answers one row may ask for (``samples``, ``sampling.n``): OpenAI's API takes n from 1 to
128, and each answer is one sequence of the engine's batch (a row asking 100,000 wedges a replica)."""
MAX_ROW_COMPLETION_TOKENS = 2**20
"""The most completion tokens one row may ask for, all its answers together (``max_tokens`` or
``max_completion_tokens`` x ``samples`` or ``sampling.n``): 128 answers of 8,192 tokens."""


class _TextJob(SwarmJob):
    """A job whose answers are text choices (chat, completion): one answer per row, or with
    ``samples`` = n > 1 n answers per row. ``text`` and ``finish_reason`` are then lists of n, in
    choice order; the row's token counts cover all n answers.

    How the n answers are asked for is ``samples_by``:

    - ``"n"``: ONE request with OpenAI's ``n`` (vLLM, SGLang and OpenAI serve it: the prompt is
      prefilled once for all n). An engine that answers with fewer choices gets the row refused
      (:class:`~prefect_swarm.exceptions.TooFewChoices`: an error row naming it), never a row with
      fewer answers than the job says.
    - ``"seeds"``: n requests per row, one after another on one of the job's request slots, each
      without ``n`` and with its own ``seed`` (the row's seed + 0..n-1, the seed being 0 when none
      is given), each retried and rate-limited as any request; their first choices, in seed order,
      are the answers, and their token counts are summed (each request's prompt is paid for).
    - ``"auto"`` (the default): ``"n"`` until the engine answers a row with fewer choices than
      asked, then ``"seeds"`` for that row and every later row of the shard (one warning says so).
    """

    outputs = _TEXT_OUTPUTS
    samples: int = 1

    def _use_samples(self, samples: int, samples_by: SamplesBy) -> None:
        name = type(self).__name__
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ConfigError(
                f"{name}: samples must be a whole number of answers per row, 1 or more (got {samples!r})."
            )
        for field, asked in (("samples", samples), ("sampling.n", self.sampling.get("n"))):
            if isinstance(asked, int) and asked > MAX_SAMPLES:
                raise ConfigError(
                    f"{name}: {field} is {asked}, more than the {MAX_SAMPLES} answers one row may ask for (OpenAI's "
                    "limit on n; each answer is a sequence in the engine's batch, so one row could wedge a "
                    "replica). Ask for fewer, or repeat the rows in the input."
                )
        answers = samples if samples > 1 else self.sampling.get("n") or 1
        longest = next((k for k in ("max_tokens", "max_completion_tokens") if k in self.sampling), None)
        most = self.sampling.get(longest) if longest else None
        if isinstance(answers, int) and isinstance(most, int) and answers * most > MAX_ROW_COMPLETION_TOKENS:
            raise ConfigError(
                f"{name}: sampling.{longest} x {'samples' if samples > 1 else 'sampling.n'} is {most:,} x "
                f"{answers} = {answers * most:,} completion tokens for one row, more than "
                f"{MAX_ROW_COMPLETION_TOKENS:,}. Lower one of them."
            )
        if samples_by not in get_args(SamplesBy):
            raise ConfigError(
                f"{name}: samples_by must be one of {', '.join(get_args(SamplesBy))} (got {samples_by!r}): 'n' asks "
                "for the answers in one request, 'seeds' in one request each, 'auto' tries 'n' first."
            )
        if samples == 1:
            return
        if "n" in self.sampling:
            raise ConfigError(
                f"{name}: give the number of answers per row as samples={samples}, not also sampling.n; "
                "remove 'n' from sampling."
            )
        if self.response_schema is not None:
            raise ConfigError(f"{name}: samples > 1 and response_schema do not go together; use one of them.")
        self.samples, self.samples_by = samples, samples_by
        self.outputs = {**self.outputs, **_SAMPLE_OUTPUTS}

    @abc.abstractmethod
    def choice_text(self, choice: dict[str, Any]) -> Any:
        """The text of one choice of the answer (each text job says where it is)."""

    def body(self, row: dict[str, Any]) -> dict[str, Any]:
        """:meth:`SwarmJob.body`, asking for ``samples`` choices when more than one (over any per-row ``n``)."""
        body = super().body(row)
        if self.samples > 1:
            body["n"] = self.samples
        return body

    def sample_requests(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``samples`` requests without ``n``, the i-th with seed = the body's seed (0 if none) + i
        (``body`` alone for one answer per row)."""
        if self.samples == 1:
            return [body]
        one = {k: v for k, v in body.items() if k != "n"}
        seed = int(one.get("seed") or 0)
        return [{**one, "seed": seed + i} for i in range(self.samples)]

    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        """First choice's text and finish reason; with ``samples`` > 1 the lists of all of them."""
        choices = body["choices"]
        if self.samples == 1:
            return {"text": self.choice_text(choices[0]), "finish_reason": choices[0].get("finish_reason")}
        if len(choices) < self.samples:
            raise TooFewChoices(
                f"asked for {self.samples} answers (n={self.samples}), the engine returned {len(choices)}: "
                "it does not serve OpenAI's n; give samples_by='seeds' (one request per answer, each with its "
                "own seed) or 'auto', or use an engine that does"
            )
        ordered = sorted(choices, key=lambda c: int(c.get("index") or 0))[: self.samples]
        return {
            "text": [self.choice_text(c) for c in ordered],
            "finish_reason": [c.get("finish_reason") for c in ordered],
        }


class ChatCompletionJob(_TextJob):
    """One chat completion per row, from a messages column, a prompt column, or a prompt template over
    several columns (``prompt_template``: ``{column}`` stands for the row's value, see
    :mod:`prefect_swarm.jobs.template`), with an optional system prompt.

    Images: a messages column may hold OpenAI multimodal content (text and ``image_url`` parts with
    an http(s) or data URL); with ``image_column`` (image bytes, or a URL string) the prompt is sent
    with that image, bytes as a data URL of ``image_mime`` (default: read from the bytes). A bad
    image is an error row; nothing is sent for it (:mod:`prefect_swarm.jobs.images`).

    Outputs ``text`` and ``finish_reason`` (lists of ``samples`` answers when it is above 1, see
    :class:`_TextJob`); token counts go to the standard usage columns.
    """

    path = "/v1/chat/completions"

    def __init__(
        self,
        prompt_column: str = "prompt",
        messages_column: str | None = None,
        system_prompt: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        sampling_column: str | None = None,
        response_schema: str | None = None,
        schema_retries: int = 2,
        image_column: str | None = None,
        image_mime: str | None = None,
        prompt_template: str | None = None,
        samples: int = 1,
        samples_by: SamplesBy = "auto",
    ) -> None:
        super().__init__(sampling, sampling_column, response_schema, schema_retries)
        self._use_samples(samples, samples_by)
        if messages_column and prompt_template:
            raise ConfigError("ChatCompletionJob: give messages_column or prompt_template, not both.")
        if messages_column and system_prompt:
            raise ConfigError("ChatCompletionJob: system_prompt goes with prompt_column, not messages_column.")
        if messages_column and image_column:
            raise ConfigError(
                "ChatCompletionJob: image_column goes with prompt_column; with messages_column put the images "
                "in the messages as image_url parts."
            )
        if image_mime and not image_mime.startswith("image/"):
            raise ConfigError(f"ChatCompletionJob: image_mime {image_mime!r} is not an image type (image/png, ...).")
        self.prompt_column = prompt_column
        self.messages_column = messages_column
        self.image_column, self.image_mime = image_column, image_mime
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.template = PromptTemplate(prompt_template) if prompt_template else None

    def columns(self) -> dict[str, str]:
        """The messages column if given, else the prompt column or the template's columns (and the image column)."""
        if self.messages_column:
            return {self.messages_column: "messages"}
        prompt = dict.fromkeys(self.template.columns, "any") if self.template else {self.prompt_column: "string"}
        if self.image_column:
            return {**prompt, self.image_column: "any"}
        return prompt

    def _prompt(self, row: dict[str, Any]) -> Any:
        return self.template.render(row) if self.template else row[self.prompt_column]

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """Chat body with the job's sampling parameters."""
        if self.messages_column:
            messages = row[self.messages_column]
            if isinstance(messages, str):
                messages = json.loads(messages)
            check_messages(messages)
        elif self.image_column:
            content = [{"type": "text", "text": self._prompt(row)}]
            content.append(image_part(row[self.image_column], self.image_mime))
            messages = [*self.system, {"role": "user", "content": content}]
        else:
            messages = [*self.system, {"role": "user", "content": self._prompt(row)}]
        return {"messages": messages, **self.sampling}

    def choice_text(self, choice: dict[str, Any]) -> Any:
        """The message content of a chat choice."""
        return (choice.get("message") or {}).get("content")


class CompletionJob(_TextJob):
    """One (legacy) text completion per row from a prompt column (``samples``: see :class:`_TextJob`)."""

    path = "/v1/completions"

    def __init__(
        self,
        prompt_column: str = "prompt",
        sampling: Mapping[str, Any] | None = None,
        sampling_column: str | None = None,
        response_schema: str | None = None,
        schema_retries: int = 2,
        samples: int = 1,
        samples_by: SamplesBy = "auto",
    ) -> None:
        super().__init__(sampling, sampling_column, response_schema, schema_retries)
        self._use_samples(samples, samples_by)
        self.prompt_column = prompt_column

    def columns(self) -> dict[str, str]:
        """The prompt column."""
        return {self.prompt_column: "string"}

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """Completion body."""
        return {"prompt": row[self.prompt_column], **self.sampling}

    def choice_text(self, choice: dict[str, Any]) -> Any:
        """The text of a completion choice."""
        return choice.get("text")


class EmbeddingJob(SwarmJob):
    """One embedding per row from a text column; outputs ``embedding`` (list of float32)."""

    path = "/v1/embeddings"
    outputs = {"embedding": pa.list_(pa.float32())}

    def __init__(
        self,
        input_column: str = "text",
        sampling: Mapping[str, Any] | None = None,
        sampling_column: str | None = None,
    ) -> None:
        super().__init__(sampling=sampling, sampling_column=sampling_column)
        self.input_column = input_column

    def columns(self) -> dict[str, str]:
        """The text column."""
        return {self.input_column: "string"}

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """Embedding body."""
        return {"input": row[self.input_column], **self.sampling}

    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        """The first embedding."""
        return {"embedding": body["data"][0]["embedding"]}


class OpenAIBatchJob(SwarmJob):
    """Rows of an OpenAI Batch input file (custom_id, method, url, body) sent as they are.

    Outputs ``response`` (the response body as JSON text); with ``output_format: openai-batch`` the
    output is the OpenAI Batch output format.
    """

    path = "/v1/chat/completions"
    outputs = {"response": pa.string()}

    def columns(self) -> dict[str, str]:
        """The url and body columns."""
        return {"url": "string", "body": "json"}

    def route(self, row: dict[str, Any]) -> str:
        """The line's url, one of :data:`~prefect_swarm.jobs.rows.input.BATCH_URLS` (a JSONL line is checked
        when the input is read; a row of a parquet input with any other url is refused here: an error
        row, nothing sent)."""
        url = row.get("url") or self.path
        problem = batch_url_problem(url)
        if problem:
            raise RowRefused(problem)
        return str(url)

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """The line's body (+ the job's sampling defaults where the body lacks them).

        A body asking for ``stream: true`` is refused (an error row, nothing sent): a batch line gets
        one whole answer, as OpenAI's Batch API requires.
        """
        body = row["body"]
        if isinstance(body, str):
            body = json.loads(body)
        if body.get("stream"):
            raise RowRefused(
                "'stream': true is not supported in a batch: each line gets one whole response. "
                "Remove 'stream' from the line's body."
            )
        return {**self.sampling, **body}

    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        """The whole body as JSON text."""
        return {"response": json.dumps(body, separators=(",", ":"))}
