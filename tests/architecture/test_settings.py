"""Every ``PREFECT_SWARM_*`` variable has one home, checked on the source.

A knob a user sets is a field of :class:`prefect_swarm.settings.Settings` (typed, described, in the
generated table ``docs/reference/settings.md``); a name the control plane writes for the processes
it starts is in :data:`prefect_swarm.interfaces.jobenv.PROTOCOL`, read by ``jobenv.env_value``.
Anywhere else, spelling such a name or reading one from ``os.environ`` fails here: a second spelling
drifts, and a knob read on the side is missing from the table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import prefect_swarm
from prefect_swarm.interfaces import jobenv

PACKAGE = Path(prefect_swarm.__file__).parent
HOMES = {"settings.py", "interfaces/jobenv.py"}
STANDALONE = {"sidecar/key_guard.py": "copied into the engine's interpreter, which need not have prefect-swarm"}
"""Files that cannot import the package, each with why; tested below to spell the name as jobenv does."""
NAME = re.compile(r"^PREFECT_SWARM_[A-Z0-9_]*$")
PROTOCOL_CONSTANTS = {k for k, v in vars(jobenv).items() if isinstance(v, str) and NAME.match(v)}
"""jobenv's names bound to a variable (``HOME``, ``API_KEY``...): reading ``os.environ[HOME]`` is a read of one."""


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _names_a_variable(node: ast.AST, aliases: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and bool(NAME.match(node.value))
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name in aliases


def _reads(node: ast.AST, aliases: set[str]) -> bool:
    """``os.environ.get(X)``, ``os.getenv(X)`` or ``os.environ[X]`` (a load) with X a variable's name."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
        func = node.func
        getter = func.attr == "getenv" or (func.attr == "get" and _is_environ(func.value))
        return getter and _names_a_variable(node.args[0], aliases)
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return _is_environ(node.value) and _names_a_variable(node.slice, aliases)
    return False


def offences(source: str) -> list[str]:
    """What ``source`` does that only the two homes may: spell a variable's name, or read one."""
    tree = ast.parse(source)
    aliases = set(PROTOCOL_CONSTANTS)
    for node in tree.body:  # a module's own name for one of jobenv's (``MINE = USER_UMASK``)
        if isinstance(node, ast.Assign) and _names_a_variable(node.value, aliases):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and _names_a_variable(node, aliases):
            found.append(f"line {node.lineno}: spells {node.value!r}")
        elif _reads(node, aliases):
            found.append(f"line {getattr(node, 'lineno', 0)}: reads {ast.unparse(node)}")
    return found


def test_a_variable_is_spelled_and_read_in_its_home_only() -> None:
    bad = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in HOMES and rel not in STANDALONE and (found := offences(path.read_text())):
            bad[rel] = found
    assert not bad, (
        f"PREFECT_SWARM_* variables outside prefect_swarm/settings.py (knobs) and interfaces/jobenv.py "
        f"(names handed to child processes): {bad}. A knob: a field of Settings, read with get_settings(); a "
        "name a process writes for its children: jobenv.PROTOCOL, read with jobenv.env_value()."
    )


@pytest.mark.parametrize(
    "source",
    [
        'import os\nx = os.environ.get("PREFECT_SWARM_FOO", "")',
        'import os\nx = os.getenv("PREFECT_SWARM_FOO")',
        "import os\nfrom prefect_swarm.interfaces.jobenv import API_KEY\nx = os.environ[API_KEY]",
        "import os\nfrom prefect_swarm.interfaces import jobenv\nx = os.environ.get(jobenv.HOME)",
        "import os\nfrom prefect_swarm.interfaces.jobenv import USER_UMASK\nMINE = USER_UMASK\nx = os.getenv(MINE)",
        'MINE = "PREFECT_SWARM_FOO"',
    ],
)
def test_the_check_sees_each_way_of_reading_or_spelling_a_variable(source: str) -> None:
    assert offences(source)


def test_writing_a_variable_for_a_child_and_naming_it_in_prose_pass() -> None:
    source = (
        "import os\nfrom prefect_swarm.interfaces import jobenv\n"
        'def f(home):\n    """Sets ``PREFECT_SWARM_HOME`` for the child."""\n    os.environ[jobenv.HOME] = home\n'
        '    raise ValueError("PREFECT_SWARM_CACHE_DIR=x is not a folder")\n'
    )
    assert offences(source) == []


def test_a_standalone_file_spells_the_name_as_jobenv_does() -> None:
    from prefect_swarm.sidecar import key_guard

    assert jobenv.API_KEY in key_guard.KEY_ENV


def test_knobs_config_fields_and_protocol_names_do_not_collide() -> None:
    """``PREFECT_SWARM_<X>`` means one thing: a setting, a config field's override, or a protocol name
    (``HOME`` and ``LOG_LEVEL`` are settings the control plane also hands on to its processes; ``API_KEY``
    is the config's ``api_key``, which the control plane hands to engines and job processes)."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.settings import ENV_PREFIX, Settings

    settings = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    config = {ENV_PREFIX + name.upper() for name in SwarmConfig.model_fields}
    assert not settings & config
    assert set(jobenv.PROTOCOL) & config == {jobenv.API_KEY}
    assert settings & set(jobenv.PROTOCOL) == {jobenv.HOME, jobenv.LOG_LEVEL}
    assert all(NAME.match(name) for name in jobenv.PROTOCOL)


def test_a_bad_setting_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_swarm.exceptions import ConfigError
    from prefect_swarm.settings import get_settings

    monkeypatch.setenv("PREFECT_SWARM_PROGRESS_EVERY_S", "-1")
    with pytest.raises(ConfigError, match=r"PREFECT_SWARM_PROGRESS_EVERY_S='-1': Input should be greater than 0"):
        get_settings()
    monkeypatch.setenv("PREFECT_SWARM_PROGRESS_EVERY_S", "2.5")
    assert get_settings().progress_every_s == 2.5
