"""The hint checker of tests/hints.py: it refuses what the CLI would refuse."""

from __future__ import annotations

import pytest
from hints import UsageError, hint_commands, parse_command


def test_hint_commands_are_the_backticked_prefect_swarm_commands() -> None:
    text = "no endpoint; `prefect-swarm up -c '/a b/config.yaml'` resubmits it, `prefect-swarm down x` stops; `ls`"
    assert hint_commands(text) == [["up", "-c", "/a b/config.yaml"], ["down", "x"]]


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "-c", "/tmp/swarm.yaml"],
        ["status", "s1"],
        ["down", "s1"],
        ["job", "wait", "job-1"],
        ["job", "cancel", "job-1"],
        ["job", "submit", "-n", "s1", "--id", "job-1"],
    ],
)
def test_commands_the_cli_takes_parse(argv: list[str]) -> None:
    assert parse_command(argv).info_name == argv[1 if argv[0] == "job" else 0]


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "hpc-flt"],  # the hint the issue found: `up` needs -c FILE
        ["up"],
        ["job", "submit", "--id", "x"],  # no -n SWARM
        ["job", "resume", "x"],
        ["status", "a", "b"],
    ],
)
def test_commands_the_cli_refuses_do_not_parse(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_command(argv)
