"""MkDocs hooks of the docs site: docstrings written with Sphinx roles render as plain code.

The package's docstrings cross-reference with Sphinx roles
(``:func:`~prefect_swarm.jobs.checkpoint.plan.recovered_text```); mkdocstrings renders docstrings as
Markdown, where a role would show raw (``:func:recovered_text``).
:func:`on_page_content` turns each into the code span it names (the last dotted part for a ``~``
reference, as Sphinx shows it).
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const|ref):<code>(~?)([^<]+)</code>")
"""A Sphinx role as Markdown renders it: ``:func:`` before a code span."""


def shown(match: re.Match[str]) -> str:
    """The code span a role names: ``~a.b.c`` shows ``c``; ``a.b.c`` shows ``a.b.c``."""
    tilde, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """Replace every rendered Sphinx role in a page by the code span it names."""
    return ROLE.sub(shown, html)
