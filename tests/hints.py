"""The commands prefect-swarm's messages tell a user to run, checked against the CLI's own parser.

    hint_commands(text) -> [["up", "-c", "/path/config.yaml"], ...]   every `prefect-swarm ...` in backticks
    parse_command(argv)                                                 click's parse, no --help, nothing run

A hint that names a subcommand or option the CLI does not have, or leaves out a required one
(``prefect-swarm up NAME``: ``up`` takes ``-c FILE``), fails :func:`parse_command` with click's
usage error. Placeholders the user fills in (``FILE``, ``ID``) parse like any value.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

import typer.core
from typer.core import TyperGroup

UsageError: type[Exception] = typer.core._click.exceptions.UsageError
"""What click raises for a command line the CLI refuses (typer carries its own click)."""

_HINT = re.compile(r"`prefect-swarm ([^`]+)`")


def hint_commands(text: str) -> list[list[str]]:
    """The argv (after ``prefect-swarm``) of every backticked ``prefect-swarm ...`` command in ``text``."""
    return [shlex.split(m.group(1)) for m in _HINT.finditer(text)]


def parse_command(argv: Sequence[str]) -> Any:
    """Parse ``prefect-swarm ARGV`` with the CLI's click command tree (callbacks are not run);
    returns the innermost command's context.

    Raises :data:`UsageError` (unknown command or option, missing required option, extra argument).
    """
    import typer.main

    from prefect_swarm.cli.main import app

    cmd: Any = typer.main.get_command(app)
    name, args = "prefect-swarm", list(argv)
    parent: Any = None
    while True:
        ctx = cmd.make_context(name, args, parent=parent)
        if not isinstance(cmd, TyperGroup):
            return ctx
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            raise UsageError(f"`{name}` needs a subcommand")
        sub_name, sub, args = cmd.resolve_command(ctx, rest)
        if sub is None or sub_name is None:
            raise UsageError(f"no such command: {rest[0]}")
        name, cmd, parent = sub_name, sub, ctx
