"""Exit codes, and the one place that turns prefect-swarm errors into a message and an exit code.

Every command (ours and the mounted ``job`` sub-app) runs under :class:`SwarmGroup`, so an error
raised on purpose anywhere below prints as one clear message on stderr, without a traceback
unless ``--debug`` was given.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

import typer
from rich.text import Text
from typer.core import TyperGroup

from prefect_swarm.exceptions import (
    USER_ERRORS,
    BackendError,
    BudgetReached,
    CapacityError,
    PrefectSwarmError,
    ReadinessError,
    StateError,
)

log = logging.getLogger("prefect_swarm.cli")


class ExitCode(enum.IntEnum):
    """What a ``prefect-swarm`` exit status means."""

    OK = 0
    FAILURE = 1  # runtime or backend failure (scheduler, API, process), a budget reached, or a declined confirmation
    BAD_INPUT = 2  # bad config or argument (ConfigError, usage errors): fix the input
    NOT_FOUND = 3  # no such swarm/job in the state database (StateError)
    NOT_READY = 4  # the swarm did not become ready, or the backend lacks capacity now
    RESUMABLE = 75  # a job stopped by the scheduler (preemption, time limit) after its flush: rerun it
    INTERRUPTED = 130  # Ctrl-C while waiting for a job: the job's processes run on (the message says how to stop them)


EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 runtime/backend failure or budget reached; 2 bad input or config; "
    "3 swarm/job not found; 4 not ready or no capacity; 75 job preempted (resumable: submit it again); "
    "130 interrupted while waiting for a job (the job runs on)."
)


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code an error maps to (most specific type first)."""
    if isinstance(exc, ReadinessError | CapacityError):
        return ExitCode.NOT_READY
    if isinstance(exc, USER_ERRORS):  # bad input, or a refused resume: fix the input or --overwrite
        return ExitCode.BAD_INPUT
    if isinstance(exc, StateError):
        return ExitCode.NOT_FOUND
    if isinstance(exc, BudgetReached):  # the job flushed and the swarm is down: a larger budget resumes it
        return ExitCode.FAILURE
    if isinstance(exc, BackendError | PrefectSwarmError):
        return ExitCode.FAILURE
    return ExitCode.FAILURE


def debug_enabled(ctx: Any) -> bool:
    """True when ``--debug`` was given to the top-level command."""
    root = ctx.find_root() if ctx is not None else None
    return bool(root and isinstance(root.obj, dict) and root.obj.get("debug"))


class SwarmGroup(TyperGroup):
    """The top-level group: maps PrefectSwarmError to a one-line-headed message and an exit code."""

    def invoke(self, ctx: Any) -> Any:  # click's Context (typer vendors click: no public name for it)
        """Run the command; translate errors raised on purpose."""
        try:
            return super().invoke(ctx)
        except PrefectSwarmError as exc:
            from prefect_swarm.cli.output import err_console

            code = exit_code_for(exc)
            if debug_enabled(ctx):
                err_console.print_exception(show_locals=False)
            kind = type(exc).__name__
            err_console.print(Text.assemble(("Error", "bold red"), f" ({kind}): {exc}"), soft_wrap=True)
            raise typer.Exit(int(code)) from None
        except PermissionError as exc:  # a file of another user's (their swarm, their state): one message
            from prefect_swarm.cli.output import err_console

            if debug_enabled(ctx):
                err_console.print_exception(show_locals=False)
            where = exc.filename or "a file prefect-swarm needs"
            err_console.print(
                Text.assemble(
                    ("Error", "bold red"),
                    f" (AccessError): you may not read or change {where} ({exc.strerror or exc}). It belongs "
                    "to another user, or others may not reach it: each user keeps their own swarms and state "
                    "(PREFECT_SWARM_HOME, backend.run_dir); ask its owner, or point yours elsewhere.",
                ),
                soft_wrap=True,
            )
            raise typer.Exit(int(ExitCode.BAD_INPUT)) from None
