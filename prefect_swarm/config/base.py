"""The base model every config model derives from: unknown keys are errors, fields are described."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config model that refuses unknown keys and validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
