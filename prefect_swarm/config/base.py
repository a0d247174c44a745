"""The base model every config model derives from (unknown keys are errors, fields are described),
and the constrained number types the config fields share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


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
