"""Slurm wall-times (``--time``, squeue's TimeLeft): the format check and the parser, free of pydantic.

The Slurm client, its LB job and batch-script helpers parse times at every start; importing the
config models for that would cost each of those processes their pydantic build.
"""

from __future__ import annotations

import re

SLURM_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
"""What ``--time`` takes here: MM, MM:SS, HH:MM:SS or D-HH:MM:SS."""


def check_slurm_time(value: str) -> str:
    """``value`` when it is a Slurm time (:data:`SLURM_TIME`), else ValueError saying what is allowed."""
    if not SLURM_TIME.match(value):
        raise ValueError(f"'{value}' is not a Slurm time (MM, MM:SS, HH:MM:SS or D-HH:MM:SS)")
    return value


def slurm_seconds(value: str) -> float | None:
    """Seconds of a Slurm time (``--time`` or squeue's TimeLeft): MM, MM:SS, H:MM:SS, D-HH[:MM[:SS]];
    None for what is no duration (``UNLIMITED``, ``INVALID``, ``NOT_SET``)."""
    days, _, rest = value.strip().rpartition("-")
    if days and not days.isdigit():
        return None
    parts = rest.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    nums = [int(p) for p in parts]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        nums += [0] * (3 - len(nums))
        return float(int(days) * 86400 + nums[0] * 3600 + nums[1] * 60 + nums[2])
    if len(nums) == 1:  # MM
        return float(nums[0] * 60)
    if len(nums) == 2:  # MM:SS
        return float(nums[0] * 60 + nums[1])
    return float(nums[0] * 3600 + nums[1] * 60 + nums[2])
