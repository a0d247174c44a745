"""Built-in jobs: chat completions, completions, embeddings, and OpenAI Batch lines as they are."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.api import SwarmJob

_TEXT_OUTPUTS = {"text": pa.string(), "finish_reason": pa.string()}


class ChatCompletionJob(SwarmJob):
    """One chat completion per row, from a messages column, or a prompt column (+ a system prompt).

    Outputs ``text`` and ``finish_reason``; token counts go to the standard usage columns.
    """

    path = "/v1/chat/completions"
    outputs = _TEXT_OUTPUTS

    def __init__(
        self,
        prompt_column: str = "prompt",
        messages_column: str | None = None,
        system_prompt: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        sampling_column: str | None = None,
    ) -> None:
        super().__init__(sampling=sampling, sampling_column=sampling_column)
        if messages_column and system_prompt:
            raise ConfigError("ChatCompletionJob: system_prompt goes with prompt_column, not messages_column.")
        self.prompt_column = prompt_column
        self.messages_column = messages_column
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []

    def columns(self) -> dict[str, str]:
        """The messages column if given, else the prompt column."""
        if self.messages_column:
            return {self.messages_column: "messages"}
        return {self.prompt_column: "string"}

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """Chat body with the job's sampling parameters."""
        if self.messages_column:
            messages = row[self.messages_column]
            if isinstance(messages, str):
                messages = json.loads(messages)
        else:
            messages = [*self.system, {"role": "user", "content": row[self.prompt_column]}]
        return {"messages": messages, **self.sampling}

    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        """First choice's text and finish reason."""
        choice = body["choices"][0]
        return {
            "text": (choice.get("message") or {}).get("content"),
            "finish_reason": choice.get("finish_reason"),
        }


class CompletionJob(SwarmJob):
    """One (legacy) text completion per row from a prompt column."""

    path = "/v1/completions"
    outputs = _TEXT_OUTPUTS

    def __init__(
        self,
        prompt_column: str = "prompt",
        sampling: Mapping[str, Any] | None = None,
        sampling_column: str | None = None,
    ) -> None:
        super().__init__(sampling=sampling, sampling_column=sampling_column)
        self.prompt_column = prompt_column

    def columns(self) -> dict[str, str]:
        """The prompt column."""
        return {self.prompt_column: "string"}

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """Completion body."""
        return {"prompt": row[self.prompt_column], **self.sampling}

    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        """First choice's text and finish reason."""
        choice = body["choices"][0]
        return {"text": choice.get("text"), "finish_reason": choice.get("finish_reason")}


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
        """The line's url."""
        return str(row.get("url") or self.path)

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """The line's body (+ the job's sampling defaults where the body lacks them)."""
        body = row["body"]
        if isinstance(body, str):
            body = json.loads(body)
        return {**self.sampling, **body}

    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        """The whole body as JSON text."""
        return {"response": json.dumps(body, separators=(",", ":"))}
