"""Shared fixtures: an isolated PREFECT_SWARM_HOME per test, and service gates.

Service gates skip locally with the install hint; under PREFECT_SWARM_REQUIRE_SERVICES=1
(``.ci/run``) they fail instead, so CI never passes on skipped integration tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import services

from prefect_swarm.paths import file_lock
from prefect_swarm.testing import free_port as free_port_fn

gate = services.gate
ROOT = Path(__file__).resolve().parents[1]


SLURM_SLOTS = 2
"""Tests that may use the single-node Slurm at once: ``scripts/slurm/start-slurm.sh`` sizes the node
for it (8 fake GPUs, 16 CPUs), and no test of one lane asks for more than half of it; a test that
needs the whole node (marker ``slurm_whole``) holds every slot."""

SECOND_LANE = frozenset(
    {
        "tests/slurm/test_slurm_faults.py",
        "tests/slurm/test_slurm_park.py",
        "tests/slurm/test_slurm_reconcile.py",
        "tests/slurm/test_slurm_shared_allocation.py",
        "tests/slurm/test_slurm_sleep.py",
    }
)
"""The test files of the Slurm group that run in its second lane (``slurm-b``), on a worker of its own,
balanced by measured time against the first: the two lanes share the one Slurm, a slot each
(:func:`slurm_lock`), so the group's waits on Slurm (time limits, queues, health) overlap instead of
adding up. (A Prefect lane would need a stack of its own: about 40 s and a server's CPU, on a suite
whose two cores are busy from its first test to its last.)"""


def service_group(nodeid: str) -> str | None:
    """The service a test shares with others, from its id: under ``pytest -n`` (``make test``) the
    tests of one group run one after another on one worker. Everything that submits to the
    single-node Slurm, the two-node test cluster (a Slurm of its own, so beside the first), the
    Prefect server tests (a Prefect stack: server, deployments, worker), the vLLM CPU engines (each
    wants every core). The Slurm group runs in two lanes (:data:`SECOND_LANE`). The
    Prefect flows on Slurm belong to the Prefect group (their stack); :func:`slurm_lock` gives them
    a Slurm slot, as it does to the Slurm lanes' tests.
    Everything else is spread over the workers one test at a time. ``pytest_collection_modifyitems``
    checks the ids against the tests' markers and fixtures, so a test in the wrong place fails."""
    path = nodeid.split("::", 1)[0]
    group = _service(path, nodeid)
    return f"{group}-b" if group and path in SECOND_LANE else group


def _service(path: str, nodeid: str) -> str | None:
    if path.startswith("tests/slurm_multinode/"):  # the two-node test cluster: a Slurm of its own
        return "slurm_multinode"
    if path.startswith(("tests/slurm/", "tests/metrics/test_slurm_metrics.py")) or ("[slurm" in nodeid):
        return "slurm"
    if path.startswith("tests/prefect/"):
        return "prefect"
    if "vllm" in Path(path).name:
        return "vllm"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """The processes the tests start get what a user's shell gives them.

    Ctrl-C as at a terminal: a suite started in the background (``cmd &`` in a script, nohup)
    inherits SIGINT ignored, and every process it starts would too, so the tests that press Ctrl-C
    on a CLI (``follow_cli``, an interrupted ``job submit``) would wait on a process that cannot
    hear it. The handler Python installs at start is restored (children then start with the default)."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The suite starts some 2,000 Python processes of this package (CLI calls, job processes, stubs,
    # sidecars); with PYTHONDONTWRITEBYTECODE set (some images set it) each would compile the
    # package's modules from source again. Let them cache their bytecode.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def _needs(item: pytest.Item) -> str | None:
    marks = {m.name for m in item.iter_markers()}
    if "slurm_multinode" in marks:
        return "slurm_multinode"
    if "slurm" in marks or "need_slurm" in item.fixturenames:
        return "slurm"
    if "prefect_server" in marks:
        return "prefect"
    return "vllm" if "vllm" in marks else None


def _flow_on_slurm(item: pytest.Item) -> bool:
    """A Prefect flow on Slurm: the Prefect group's stack, Slurm under the lock of need_slurm."""
    return (
        _needs(item) == "slurm"
        and _service(item.nodeid.split("::", 1)[0], item.nodeid) == "prefect"
        and bool(item.get_closest_marker("prefect_server"))
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Check each test's group, and run the Prefect flows on Slurm last in their group: the Slurm
    lanes take their slots test after test from the start, and a flow test waiting for one (behind
    the three-minute time-limit test, say) stalls its whole Prefect lane; late in the run the Slurm
    lanes have ended or run short tests. The order is the same on every xdist worker (a stable sort).
    A file of :data:`SECOND_LANE` that no longer exists fails the run (a renamed file would silently
    change lanes)."""
    gone = sorted(path for path in SECOND_LANE if not (ROOT / path).is_file())
    if gone:
        raise pytest.UsageError(f"SECOND_LANE in tests/conftest.py names files that do not exist: {gone}")
    items.sort(key=_flow_on_slurm)
    for item in items:
        need = _needs(item)
        if _flow_on_slurm(item):
            continue
        if need and _service(item.nodeid.split("::", 1)[0], item.nodeid) != need:
            raise pytest.UsageError(
                f"{item.nodeid} needs {need} but its id puts it in group {service_group(item.nodeid)}: "
                "move it next to the tests of that service, or extend service_group() in tests/conftest.py."
            )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist: whole service groups to one worker each (see :func:`service_group`)."""
    from xdist.scheduler import LoadScopeScheduling

    class ServiceGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return service_group(nodeid) or nodeid

    return ServiceGroups(config, log)


_GROUP_SECONDS: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sum each service group's time (setup + call + teardown); on the xdist controller too."""
    group = service_group(report.nodeid) or "spread"
    _GROUP_SECONDS.setdefault(group, [0.0, 0])[0] += report.duration
    if report.when == "call":
        _GROUP_SECONDS[group][1] += 1


_CPU_LOG = os.environ.get("PREFECT_SWARM_TEST_CPU_LOG")
"""A file that gets one JSON line per test: its xdist worker, its start and end (epoch seconds), the
CPU seconds its worker spent (``self``) and those of the processes it started and waited for
(``children``; daemons handed to init are not counted)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if not _CPU_LOG:
        yield
        return
    import json
    import resource
    import time

    kids, mine, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time(), time.time()
    yield
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
        "start": round(start, 1),
        "end": round(time.time(), 1),
        "self": round(time.process_time() - mine, 2),
        "children": round(after.ru_utime + after.ru_stime - kids.ru_utime - kids.ru_stime, 2),
    }
    with open(_CPU_LOG, "a") as log:
        log.write(json.dumps(row) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per group: a group runs on one worker, so its sum bounds the suite's wall time."""
    if _GROUP_SECONDS and not os.environ.get("PYTEST_XDIST_WORKER"):
        by_time = sorted(_GROUP_SECONDS.items(), key=lambda kv: -kv[1][0])
        parts = [f"{g} {int(t)} s ({int(n)} tests)" for g, (t, n) in by_time]
        terminalreporter.write_line("time per service group: " + ", ".join(parts))


@pytest.fixture(autouse=True)
def swarm_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own PREFECT_SWARM_HOME (state.db, swarm folders)."""
    home = tmp_path_factory.mktemp("swarm-home")
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(home))
    for key in list(os.environ):
        if key.startswith("PREFECT_SWARM_") and key not in (
            "PREFECT_SWARM_HOME",
            "PREFECT_SWARM_REQUIRE_SERVICES",
            "PREFECT_SWARM_VLLM_PYTHON",
            "PREFECT_SWARM_TINY_MODEL",
            "PREFECT_SWARM_CACHE",
        ):
            monkeypatch.delenv(key)
    return home


_shared_vllm = contextlib.ExitStack()
_shared_vllm_users: set[str] = set()


@pytest.fixture(scope="session")
def vllm_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One vLLM OpenAI server (CPU build, the tiny model as ``tiny``, API key ``services.VLLM_KEY``)
    started outside prefect-swarm, as a user's own server would be, for the tests that only send it
    requests: ``(url, process)``. A start costs ~25 CPU-s, an idle server ~0.02 CPU-s a second, and
    the vLLM group runs on one worker, so a run starts it once. Stopped after the last test of the
    session that uses it (:func:`pytest_runtest_teardown`), else when the session ends."""
    gate(services.missing_vllm())
    _shared_vllm_users.update(item.nodeid for item in request.session.items if "vllm_server" in item.fixturenames)
    log = tmp_path_factory.mktemp("vllm-shared") / "vllm.log"
    with _shared_vllm:
        yield _shared_vllm.enter_context(services.vllm_server(log, "--api-key", services.VLLM_KEY))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Stop the shared vLLM server once the last test using it is torn down (its module's fixtures
    included: this runs after pytest's own teardown). Under xdist a worker that has not run every
    such test keeps it to the session's end; the vLLM group keeps them on one worker."""
    if item.nodeid in _shared_vllm_users:
        _shared_vllm_users.discard(item.nodeid)
        if not _shared_vllm_users:
            _shared_vllm.close()


@pytest.fixture
def need_vllm() -> None:
    """Gate on the vLLM CPU build and tiny model."""
    gate(services.missing_vllm())


@pytest.fixture(autouse=True)
def slurm_lock(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test that uses the single-node Slurm (its ``slurm`` marker or ``need_slurm``, as
    :func:`_needs` tells) holds one of the run's Slurm slots for its whole life, fixtures included:
    Slurm takes :data:`SLURM_SLOTS` tests at a time whichever worker runs them (the two Slurm lanes',
    or a Prefect flow on Slurm in the prefect group), a ``slurm_whole`` test alone. The slots' locks
    lie beside the workers' temp folders."""
    if _needs(request.node) != "slurm":
        yield
        return
    mine = tmp_path_factory.getbasetemp()
    run_root = mine.parent if os.environ.get("PYTEST_XDIST_WORKER") else mine  # shared by this run's workers
    with _slurm_slots(run_root, whole=request.node.get_closest_marker("slurm_whole") is not None):
        yield


@contextlib.contextmanager
def _slurm_slots(run_root: Path, whole: bool) -> Iterator[None]:
    """One of the run's :data:`SLURM_SLOTS` (the first free one), or all of them for a test that needs
    the whole node (taken in order, so two such tests cannot deadlock)."""
    from prefect_swarm.testing import wait_until

    paths = [run_root / f"slurm-{i}.lock" for i in range(SLURM_SLOTS)]
    with contextlib.ExitStack() as held:
        if whole:
            for path in paths:
                held.enter_context(file_lock(path))
        else:  # another lane's test holds a slot for minutes at most
            held.callback(wait_until("a free Slurm slot", lambda: _take_slot(paths), timeout_s=3600, poll_s=0.5).close)
        yield


def _take_slot(paths: list[Path]) -> Any:
    """The open file of the first slot locked without waiting (closing it frees the slot), else None."""
    import fcntl

    for path in paths:
        fh = open(path, "a")  # noqa: SIM115 - the caller closes it
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            continue
        return fh
    return None


@pytest.fixture
def need_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Gate on a running single-node Slurm (with sacct) and nginx (held under :func:`slurm_lock`);
    after the test, every Slurm job it submitted must have left the queue (a leak holds GPUs that
    later tests then wait for). Jobs of another pytest session on the same Slurm (their scripts
    under its temp folder) are not counted."""
    gate(services.missing_slurm() or services.missing_nginx())
    mine = tmp_path_factory.getbasetemp()
    before = services.slurm_job_ids(mine)
    yield
    leaked = services.slurm_jobs_left(before, wait_s=30, mine=mine)
    if leaked:
        subprocess.run(["scancel", *leaked], check=False)
        pytest.fail(f"the test left Slurm jobs in the queue (now cancelled): {' '.join(leaked)}")


@pytest.fixture
def need_nginx() -> None:
    """Gate on the nginx binary."""
    gate(services.missing_nginx())


@pytest.fixture
def need_lepton_sdk() -> None:
    """Gate on the leptonai SDK."""
    gate(services.missing_lepton_sdk())


@pytest.fixture
def free_port() -> Callable[[], int]:
    """Call to get a free loopback port."""
    return free_port_fn


def cli_argv() -> list[str]:
    """The installed ``prefect-swarm`` script, else ``python -m prefect_swarm.cli.main``."""
    script = Path(sys.executable).with_name("prefect-swarm")
    if script.exists():
        return [str(script)]
    found = shutil.which("prefect-swarm")
    return [found] if found else [sys.executable, "-m", "prefect_swarm.cli.main"]


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``prefect-swarm ARGS`` in a subprocess with this test's environment."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
        return subprocess.run([*cli_argv(), *args], capture_output=True, text=True, env=full_env, timeout=timeout)

    return run


class FollowedCli:
    """A ``prefect-swarm`` command left running (``logs --follow``), its stdout gathered in a thread."""

    def __init__(self, args: tuple[str, ...], env: dict[str, str]) -> None:
        import threading

        self.proc = subprocess.Popen(
            [*cli_argv(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.out = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out += line

    def wait_for(self, text: str, timeout: float = 30) -> None:
        """Until ``text`` was printed (AssertionError with what was, after ``timeout`` seconds)."""
        from prefect_swarm.testing.waiting import wait_until

        wait_until(f"{text!r} printed", self._printed, until=lambda out: text in out, timeout_s=timeout, poll_s=0.1)

    def _printed(self) -> str:
        """What it printed so far; AssertionError (the wait ends) once it exited and all is read."""
        out = self.out
        if self.proc.poll() is not None and not self._reader.is_alive():
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"exited {self.proc.returncode}: {out!r} {err!r}")
        return out

    def stop(self) -> int:
        """Ctrl-C it; its exit code."""
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(60)  # a second quiet; a loaded machine has taken more than 15
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def follow_cli() -> Iterator[Callable[..., FollowedCli]]:
    """Start ``prefect-swarm ARGS`` left running (Ctrl-C'd at the end of the test if still alive)."""
    started: list[FollowedCli] = []

    def start(*args: str, env: dict[str, str] | None = None) -> FollowedCli:
        cli = FollowedCli(args, {**os.environ, "COLUMNS": "200", **(env or {})})
        started.append(cli)
        return cli

    yield start
    for cli in started:
        cli.stop()
