"""Loading jobs by reference: a clear ConfigError for every way a reference can be wrong."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.api import SwarmJob, load_job
from prefect_swarm.jobs.builtin import ChatCompletionJob


class _NoParse(SwarmJob):
    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        return {}


@pytest.fixture
def jobs_module() -> types.ModuleType:
    mod = types.ModuleType("psw_test_jobs")
    mod.NoParse = _NoParse  # type: ignore[attr-defined]
    mod.NotAJob = dict  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


def test_short_name_builds_the_builtin_job() -> None:
    assert isinstance(load_job("chat", {"prompt_column": "q"}), ChatCompletionJob)


@pytest.mark.parametrize(
    ("ref", "kwargs", "needle"),
    [
        ("no_such_module_psw:Job", {}, "cannot import module 'no_such_module_psw'"),
        ("psw_test_jobs:NotAJob", {}, "is not a SwarmJob subclass"),
        ("psw_test_jobs:NoParse", {}, "does not implement parse"),
        ("chat", {"no_such_kwarg": 1}, "bad job_kwargs"),
    ],
)
def test_bad_references_are_config_errors(jobs_module: types.ModuleType, ref: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_job(ref, kwargs)
