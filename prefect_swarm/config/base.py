"""The base model every config model derives from (unknown keys are errors, fields are described),
and the constrained number types the config fields share."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """A config model that refuses unknown keys and validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


Count = Annotated[int, Field(ge=1)]
"""A count of at least one (replicas, CPUs, rows)."""

NonNegativeInt = Annotated[int, Field(ge=0)]
"""A whole number, zero allowed (GPUs of a CPU engine, restarts, seconds of notice)."""

Seconds = Annotated[float, Field(gt=0)]
"""A duration or interval in seconds, more than zero (timeouts, poll intervals)."""

NonNegativeSeconds = Annotated[float, Field(ge=0)]
"""A delay in seconds, zero allowed (grace periods, back-off)."""

Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port."""

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""What an environment variable's name looks like (the one rule: config fields and rendered scripts)."""


def check_env_name(value: str) -> str:
    """``value`` when it is an environment variable's name; else ValueError that does not echo it (a
    field that wants a variable's *name* is where a key gets pasted by mistake)."""
    if not ENV_NAME.match(value):
        raise ValueError(
            "is not an environment variable name (letters, digits and '_', not a digit first); the value is "
            "not shown, in case it is a key pasted by mistake: give the name of the variable that holds it"
        )
    return value


EnvName = Annotated[str, AfterValidator(check_env_name)]
"""The name of an environment variable (``api_key_env``, ``token_env``, the keys of ``secret_env``)."""
