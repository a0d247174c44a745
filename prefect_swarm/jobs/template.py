"""Prompt templates: a prompt made from several columns of a row.

``{column}`` stands for the row's value of ``column`` (text as it is; a list or mapping as JSON;
anything else as ``str``); ``{{`` and ``}}`` are literal braces. Nothing else is interpreted: no
attribute or index lookups, no conversions, no format specs, no code. A row whose value for a
referenced column is null is refused (an error row, nothing sent). In a pipeline the outputs of
the earlier stages are columns too (``{generate_text}``, see :mod:`prefect_swarm.jobs.stages`)::

    ChatCompletionJob(prompt_template="Question: {prompt}\\nAnswer: {generate_text}\\nIs the answer right?")
"""

from __future__ import annotations

import json
import string
from typing import Any

from prefect_swarm.exceptions import ConfigError, RowRefused


class PromptTemplate:
    """A parsed template: its literal pieces and the columns between them (parsed once, rendered per row)."""

    def __init__(self, text: str, field: str = "prompt_template") -> None:
        self.text = text
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise ConfigError(
                f"{field}: {exc} in {text!r}. Write a column as {{column}}; a literal brace as {{{{ or }}}}."
            ) from None
        self.pieces: list[tuple[str, str | None]] = []
        for literal, name, spec, conversion in parsed:
            if name is not None and (not name or spec or conversion):
                shown = (
                    "{" + (name or "") + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                )
                raise ConfigError(
                    f"{field}: {shown} is not a column reference. Write {{column}} with a column name only "
                    "(no conversion, format or empty braces); a literal brace is {{ or }}."
                )
            self.pieces.append((literal, name))
        self.columns: list[str] = list(dict.fromkeys(name for _, name in self.pieces if name is not None))
        """The columns the template reads, in order of first use."""
        if not self.columns:
            raise ConfigError(f"{field}: {text!r} names no column; write one as {{column}}.")

    def render(self, row: dict[str, Any]) -> str:
        """The text for ``row``; RowRefused when a referenced value is null."""
        out = []
        for literal, name in self.pieces:
            out.append(literal)
            if name is not None:
                out.append(_text(name, row.get(name)))
        return "".join(out)


def _text(name: str, value: Any) -> str:
    if value is None:
        raise RowRefused(f"prompt_template: column '{name}' is null in this row; nothing was sent.")
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)
