"""The only code that knows the on-disk layout under ``$PREFECT_SWARM_HOME``.

<home>/state.db
<home>/defaults.yaml
<home>/swarms/<name>/            SwarmPaths (<run_dir>/swarms/<name> when the backend sets run_dir: SwarmPaths.of)
    config.yaml                  redacted config as brought up
    replica-<i>.status.json      watchdog status (atomic writes)
    replica-<i>.log              engine stdout+stderr
    replica-<i>.head             host:port once healthy (Slurm); replica-<i>.drain: leaving (scale down)
    replica-<i>.asleep           sleeping replica (url, level): out of rotation, allocation kept
    watchdog-<i>.log / .pid / .json   watchdog log, pid record, spec (no secrets)
    replicas.sbatch lb.sbatch nginx.conf slurm.json slurm.lock   scripts, wanted/submitted tasks, lock (Slurm)
    swarm.key                    the swarm's API key, mode 0600 (its api_key, or generated on Slurm)
    owner.id                     this home's identity of the swarm, marked on what it makes (Lepton)
    ray.token                    generated Ray auth token, mode 0600 (Slurm, replicas spanning nodes over Ray)
    lb/auth.conf                 the LB's key check (nginx map), mode 0600, written by the LB job
    engine-path/psw_key_guard.py the key check of a closed vLLM replica (--middleware; on its PYTHONPATH)
    upstreams.conf lb.head lb/ steps/ replicas-<job>_<task>.out lb-<job>.out   the LB's files (Slurm)
    lb.failed                    why the LB job stopped before nginx started (its setup failed; Slurm)
    stopped.json                 why the swarm stopped itself (its budget; local: the watchdogs stop on it)
    budget.json budget.lock      the swarm's spend account (token-priced caps) and its lock
    targets.json                 Prometheus file_sd list of the replicas' /metrics (local, Slurm)
    jobs/<job_id>/               JobPaths
<home>/jobs/<job_id>/            JobPaths.standalone (a job against no recorded swarm)
<home>/pipelines/<pipeline_id>/  PipelinePaths: stage-<i>-<name>.parquet, stage-<i>-<name>.input.parquet, *.from.json
<home>/cache/responses.db        the response cache across jobs (SQLite; PREFECT_SWARM_CACHE_DIR moves the folder)
<job_dir>/                       JobPaths (also used for ledgers outside a swarm folder)
    spec.json  manifest.json  failed.jsonl  validated.json  input.json  commit.lock
    launch.json  logs/shard-<i>.log  logs/shard-<i>.exit.json   (local compute backend)
    shards/<i>/                  ShardPaths
        part-<seq>.parquet  progress.json  index.json  fingerprint.json  job.log  DONE
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Self

from prefect_swarm.interfaces.jobenv import HOME, USER_UMASK, env_value

if TYPE_CHECKING:
    from prefect_swarm.exceptions import AccessError

TEMP_SUFFIX = ".tmp"
"""Suffix of the temp files atomic writes rename into place (``.<name>.<random>.tmp``)."""
PROBE_PREFIX = ".prefect-swarm-probe-"
"""Name start of the probe file/object created and deleted next to an output (or in an object-store
ledger) to prove it writable before any request (:func:`probe_name`)."""


def temp_name(of: str, tag: str) -> str:
    """The one naming rule of a temporary file or object prefect-swarm writes on its way to ``of`` (a
    final name in the same folder): ``.<of>.<tag>.tmp``. What a killed run left, the next run's
    clean-up of ``of`` finds by :func:`is_temp_of`."""
    return f".{of}.{tag}{TEMP_SUFFIX}"


def is_temp_of(of: str, name: str) -> bool:
    """Whether ``name`` is a temporary of ``of`` (:func:`temp_name`)."""
    return name.startswith(f".{of}.") and name.endswith(TEMP_SUFFIX)


def probe_name(tag: str) -> str:
    """A write probe's name (``.prefect-swarm-probe-<tag>.tmp``): a probe belongs to no final name, so
    every probe prefect-swarm writes in a folder is found by :func:`is_probe` there."""
    return f"{PROBE_PREFIX}{tag}{TEMP_SUFFIX}"


def is_probe(name: str) -> bool:
    """Whether ``name`` is a write probe (:func:`probe_name`): left only by a run killed between its
    write and its delete, removed by the next check of that folder."""
    return name.startswith(PROBE_PREFIX) and name.endswith(TEMP_SUFFIX)


PRIVATE_UMASK = 0o077
"""The umask of every process prefect-swarm starts or runs as its entry point: what it creates is its
user's alone (folders 0700, files 0600, logs included)."""
PRIVATE_DIR_MODE = 0o700
"""Mode of every folder prefect-swarm makes for a swarm or a job (:func:`private_dir`)."""


PREFECT_FILES = "prefect"
"""Where in ``$PREFECT_SWARM_HOME`` :func:`keep_prefect_off_home` puts Prefect's own files."""


def keep_prefect_off_home() -> None:
    """Prefect's own files (its profiles, the database of the temporary server a flow run starts when
    no ``PREFECT_API_URL`` is set) go to ``$PREFECT_SWARM_HOME/prefect`` rather than ``~/.prefect``
    when ``PREFECT_SWARM_HOME`` is set, ``PREFECT_HOME`` is not, and there is no ``~/.prefect``: a
    submit host whose prefect-swarm home is moved off ``$HOME`` gets nothing written under ``$HOME``.
    An existing ``~/.prefect`` is the user's Prefect profile (it may name their server) and is kept.
    Only before Prefect is imported (Prefect reads its settings then); run when prefect_swarm is
    imported, so stdlib only (the settings' ``home`` is this variable, expanded)."""
    import sys

    given = env_value(HOME)
    if "prefect" in sys.modules or os.environ.get("PREFECT_HOME") or not given:
        return
    if Path("~/.prefect").expanduser().exists():
        return
    home = Path(given).expanduser()
    try:
        home.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)  # Prefect makes its folder, not those above
    except OSError:
        return  # prefect-swarm's own commands say what is wrong with the folder
    os.environ["PREFECT_HOME"] = str(home / PREFECT_FILES)


def private_umask() -> None:
    """Give this process :data:`PRIVATE_UMASK`: called first by each of prefect-swarm's entry points
    (the CLI, a job process, a watchdog, the Slurm LB and replica helpers, model staging), so that
    every file and folder they and their children create is 0600 / 0700 whatever the caller's umask.
    The caller's own umask is kept for its children in ``PREFECT_SWARM_USER_UMASK`` (``jobenv.USER_UMASK``)."""
    old = os.umask(PRIVATE_UMASK)
    os.environ.setdefault(USER_UMASK, f"{old:o}")


def user_umask() -> int:
    """The user's umask: ``PREFECT_SWARM_USER_UMASK`` when an entry point set it (a job's committed output is
    the user's file, made with it), else this process's."""
    with suppress(ValueError):
        return int(env_value(USER_UMASK) or "", 8) & 0o777
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it (and put it back at once)
    os.umask(mask)
    return mask


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _replaceable_by_others(st: os.stat_result) -> str:
    """Why another user could replace what is inside the folder ``st`` describes, or ''.

    A folder others may write lets them rename or swap its entries, unless it is sticky (as ``/tmp``)
    and owned by this user or root (a sticky folder's owner may still rename what is in it)."""
    mode, uid = stat.S_IMODE(st.st_mode), os.geteuid()
    if not mode & 0o022:
        return ""
    if not mode & stat.S_ISVTX:
        return f"other users may write it (mode {mode:o})"
    if st.st_uid not in (uid, 0):
        return f"it is a shared folder of {_owner(st.st_uid)}, who may replace what is in it (mode {mode:o})"
    return ""


def _refuse(path: Path, why: str) -> AccessError:
    from prefect_swarm.exceptions import AccessError

    return AccessError(
        f"{path}: {why}. prefect-swarm keeps a swarm's and a job's files (scripts it submits, keys, "
        f"ledgers) only where no other user can change them: use a folder of your own "
        f"(`mkdir -m 700 <folder>`, as backend.run_dir or PREFECT_SWARM_HOME), or remove this one if it "
        f"is not yours to keep."
    )


def private_dir(path: Path, *, exists: Callable[[Path], bool] = os.path.lexists) -> Path:
    """THE rule for a folder that holds a swarm's or a job's files; returns ``path``.

    Missing folders are created 0700 by this user. An existing ``path`` must be a real folder (not a
    link) that this user owns and no one else may write (its read bits for others are dropped); each
    existing folder above it must not let another user replace what is below it (see
    :func:`_replaceable_by_others`; a sticky ``/tmp``-like scratch is fine). Anything else is
    refused with one :class:`~prefect_swarm.exceptions.AccessError` naming the folder: on a shared
    scratch another user could otherwise plant the scripts this user's jobs run.

    ``exists`` is the look at which folders are there already (anything, even a dangling link, counts);
    another user may make one right after it, which the mkdir then finds and judges.
    """
    path = Path(os.path.abspath(path))
    chain = [path, *path.parents]
    first = next((i for i, p in enumerate(chain) if exists(p)), len(chain) - 1)
    for above in chain[max(first, 1) :]:
        why = _replaceable_by_others(os.stat(above))
        if why:
            raise _refuse(above, why)
    for p in reversed(chain[:first]):
        try:
            os.mkdir(p, PRIVATE_DIR_MODE)
        except PermissionError:
            raise _refuse(p, f"you may not create it in {p.parent} ({_owner(os.stat(p.parent).st_uid)}'s)") from None
        except FileExistsError:  # someone made it after we looked: judged as any folder found (``path`` below)
            if p != path and (why := _replaceable_by_others(os.lstat(p))):
                raise _refuse(p, why) from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "it is not a folder" + (" (a symbolic link)" if stat.S_ISLNK(st.st_mode) else ""))
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"it belongs to {_owner(st.st_uid)}, not to you ({_owner(os.geteuid())})")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise _refuse(path, f"other users may write it (mode {stat.S_IMODE(st.st_mode):o})")
    if stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` (empty) 0600 when missing, or drop others' bits of this user's own file; returns it.
    For files others open by name with their default mode (SQLite's database, a log an engine appends)."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise _refuse(path, f"it belongs to {_owner(st.st_uid)}, not to you ({_owner(os.geteuid())})")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return path


def open_log(path: Path) -> BinaryIO:
    """Open the log file ``path`` for appending (bytes), created 0600 (with its folder, 0700) when missing."""
    if not path.parent.is_dir():
        private_dir(path.parent)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path``, fsync, then rename over ``path``."""
    with atomic_file(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temp path beside ``path`` to write; on success fsync and rename it over ``path``.

    For writers that need a file name (a parquet writer streaming batches). On error the temp
    file is removed and ``path`` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)  # temp_name's rule
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600, with its folder, when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def atomic_write_text(path: Path, text: str) -> None:
    """Atomic text write (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode())


def read_secret(path: Path, what: str) -> str | None:
    """The secret in ``path`` (a 0600 file: a swarm's API key, its Ray token); None when there is none.
    A file others can read is refused (ConfigError), and so is a symlink."""
    from prefect_swarm.exceptions import ConfigError

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as fh:
        mode = stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"{path} ({what}) can be read by other users (mode {mode:o}). "
                f"`prefect-swarm down` the swarm and delete the file (the next `up` makes a new one), or "
                f"`chmod 600 {path}` if nobody else read it."
            )
        return fh.read().strip() or None


def write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path``, mode 0600 from its creation, atomically (replaces an older one)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp files are 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secret + "\n")
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    """Atomic JSON write."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def read_json(path: Path, default: Any = None) -> Any:
    """Read JSON, or ``default`` when the file is missing or half-written."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return default


def read_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a (log) file, read from its last 64 KiB; '' when it is missing."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            tail = deque(fh.read().decode("utf-8", "replace").splitlines(), maxlen=lines)
    except OSError:
        return ""
    return "\n".join(tail)


def read_text(path: Path) -> str | None:
    """A small file's text, stripped; None when it is missing or empty (a head file not written yet)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


NETWORK_FS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "afs", "9p"}
    | {"pvfs2", "orangefs", "panfs", "wekafs", "ocfs2", "gfs2", "vboxsf", "virtiofs"}
)
"""Filesystem types (``/proc/mounts``) on which SQLite's WAL mode is unsafe; ``fuse.*`` too (the state
database and the response cache pick their journal with :func:`journal_for`)."""
MOUNTS = Path("/proc/mounts")


def filesystem_type(path: Path, mounts: Path = MOUNTS) -> str | None:
    """The type of the filesystem holding ``path`` (the longest mount point above it in ``mounts``);
    None when the table cannot be read."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    target, best, found = str(path.resolve()), -1, None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, found = len(point), fields[2]
    return found


def journal_for(folder: Path, setting: str = "auto", mounts: Path = MOUNTS) -> str:
    """The journal mode for a database in ``folder``: ``setting`` unless 'auto'; then 'delete' (a
    rollback journal) on a network filesystem, 'wal' elsewhere."""
    if setting != "auto":
        return setting
    fs = filesystem_type(folder, mounts) or ""
    return "delete" if fs in NETWORK_FS or fs == "fuse" or fs.startswith("fuse.") else "wal"


def cache_db(folder: Path) -> Path:
    """The response cache's SQLite database in ``folder`` (see :mod:`prefect_swarm.jobs.dispatch.cache`)."""
    return folder / "responses.db"


def home_dir() -> Path:
    """``$PREFECT_SWARM_HOME`` expanded."""
    from prefect_swarm.settings import get_settings  # pydantic-settings: not for processes given their folders

    return get_settings().home_dir


_REPLICA_HEAD = re.compile(r"^replica-(\d+)\.head$")


def _per_replica(pattern: str, doc: str) -> Callable[[SwarmPaths, int], Path]:
    """A method ``paths.<name>(i)`` -> the file ``pattern`` (``{i}`` = replica index) in the swarm folder."""

    def path(self: SwarmPaths, i: int) -> Path:
        return self.root / pattern.format(i=i)

    path.__doc__ = doc
    return path


@dataclass(frozen=True)
class Folder:
    """A folder whose files one object names (the subclasses below)."""

    root: Path

    def ensure(self) -> Self:
        """Create the folder (0700), or check that an existing one is this user's alone
        (:func:`private_dir`); return self."""
        private_dir(self.root)
        return self


class SwarmPaths(Folder):
    """Files of one swarm."""

    @classmethod
    def for_swarm(cls, name: str, base: Path | None = None) -> SwarmPaths:
        """The folder of swarm ``name`` under ``base`` (default ``$PREFECT_SWARM_HOME``)."""
        return cls((base or home_dir()) / "swarms" / name)

    @classmethod
    def of(cls, name: str, run_dir: str | None) -> SwarmPaths:
        """THE rule for where swarm ``name`` keeps its files: ``<run_dir>/swarms/<name>`` when its
        backend has a run dir (Slurm ``backend.run_dir``, seen by every node), else under
        ``$PREFECT_SWARM_HOME``. Its jobs (spec, ledgers, part files, manifest) live in its folder too,
        so nothing of a Slurm swarm lands in ``$HOME`` but the state database."""
        return cls.for_swarm(name, Path(run_dir).expanduser() if run_dir else None)

    @property
    def config(self) -> Path:
        """Redacted config as brought up."""
        return self.root / "config.yaml"

    replica_status = _per_replica("replica-{i}.status.json", "Watchdog status file of replica ``i``.")
    replica_log = _per_replica("replica-{i}.log", "Engine log of replica ``i``.")
    replica_head = _per_replica("replica-{i}.head", "Head file (``host:port``) of replica ``i``, written once healthy.")
    replica_drain = _per_replica(
        "replica-{i}.drain", "Marker (Slurm): replica ``i`` is leaving; its task stops publishing its head file."
    )
    replica_asleep = _per_replica(
        "replica-{i}.asleep",
        "Marker (JSON: url, level, since): replica ``i`` sleeps or is going to; out of rotation, allocation kept.",
    )
    watchdog_log = _per_replica("watchdog-{i}.log", "Watchdog log of replica ``i``.")
    watchdog_pid = _per_replica(
        "watchdog-{i}.pid", "Pid record (JSON: pid, create_time) of the watchdog of replica ``i`` (local backend)."
    )
    watchdog_spec = _per_replica("watchdog-{i}.json", "JSON spec the watchdog of replica ``i`` runs from (no secrets).")

    @property
    def metrics_targets(self) -> Path:
        """Prometheus file_sd list (JSON) of the replica engines' ``/metrics`` (see interfaces.metrics)."""
        return self.root / "targets.json"

    @property
    def stage_log(self) -> Path:
        """Log of the model stagers (Slurm: ``prefect_swarm.sidecar.stage`` on every node appends to it)."""
        return self.root / "stage.log"

    def replica_heads(self) -> dict[int, Path]:
        """Replica index -> head file, for every head file present now."""
        found = (_REPLICA_HEAD.match(p.name) for p in self.root.glob("replica-*.head"))
        return {int(m.group(1)): self.root / m.group(0) for m in found if m}

    # Slurm: rendered scripts, the submitted-jobs record, the load balancer's files.
    @property
    def replicas_script(self) -> Path:
        """sbatch script of the replica array job."""
        return self.root / "replicas.sbatch"

    @property
    def lb_script(self) -> Path:
        """sbatch script of the load-balancer job."""
        return self.root / "lb.sbatch"

    @property
    def nginx_conf(self) -> Path:
        """nginx.conf of the load balancer."""
        return self.root / "nginx.conf"

    @property
    def upstreams(self) -> Path:
        """The include nginx reads its upstream servers from (rewritten by the reconciler)."""
        return self.root / "upstreams.conf"

    @property
    def lb_head(self) -> Path:
        """``host:port`` of the load balancer, written once nginx answers."""
        return self.root / "lb.head"

    @property
    def lb_dir(self) -> Path:
        """nginx's own folder (listen.conf, error log, temp folders)."""
        return self.root / "lb"

    @property
    def lb_failed(self) -> Path:
        """Why the LB job stopped before nginx started (its ``setup`` failed: the line); removed when
        an LB job starts."""
        return self.root / "lb.failed"

    @property
    def lb_error_log(self) -> Path:
        """nginx's error log."""
        return self.lb_dir / "error.log"

    @property
    def stopped(self) -> Path:
        """Why the swarm stopped itself (local backend: a watchdog holding its budget): JSON ``{at,
        reason}``; every watchdog of the swarm stops on it, ``status`` shows it; the next ``up`` removes it."""
        return self.root / "stopped.json"

    @property
    def parked(self) -> Path:
        """The snapshot of a parked swarm (JSON, 0600, no secret): what ``restore`` needs to bring it back
        fast (see :class:`~prefect_swarm.interfaces.parking.Snapshot`). There while the swarm is parked: its
        job processes read its presence as "paused, not an outage"; removed once the restored swarm is
        ready, or by ``down``."""
        return self.root / "parked.json"

    @property
    def budget_account(self) -> Path:
        """The swarm's spend account (:mod:`prefect_swarm.budget`): JSON ``{epoch, spent_usd, held}``,
        shared by every job process on the swarm, changed only under :attr:`budget_lock`."""
        return self.root / "budget.json"

    @property
    def budget_lock(self) -> Path:
        """Held (flock) by whoever reads or changes :attr:`budget_account`."""
        return self.root / "budget.lock"

    @property
    def slurm_record(self) -> Path:
        """Job ids and plan hashes of what ``up`` submitted (no secrets)."""
        return self.root / "slurm.json"

    @property
    def api_key_file(self) -> Path:
        """The swarm's API key, mode 0600, never in state or logs: its ``api_key``, kept by ``up`` so that
        every later command and job of this user finds it; on Slurm without ``api_key``, the key it generated."""
        return self.root / "swarm.key"

    @property
    def owner_file(self) -> Path:
        """This home's identity of the swarm on a platform other users share (Lepton marks what the
        swarm makes with it, and touches nothing without it); made at its first ``up``, not a secret."""
        return self.root / "owner.id"

    @property
    def ray_token_file(self) -> Path:
        """The token of the swarm's Ray clusters (replicas spanning nodes), mode 0600; Ray reads it
        through ``RAY_AUTH_TOKEN_PATH``. Never in state, a script or a log."""
        return self.root / "ray.token"

    @property
    def engine_path_dir(self) -> Path:
        """A folder put on a closed vLLM replica's ``PYTHONPATH``; holds only :attr:`key_guard_module`."""
        return self.root / "engine-path"

    @property
    def key_guard_module(self) -> Path:
        """``psw_key_guard.py``: prefect_swarm.sidecar.key_guard, copied for the engine's interpreter."""
        return self.engine_path_dir / "psw_key_guard.py"

    @property
    def lb_auth_conf(self) -> Path:
        """The LB's key check (an nginx ``map`` holding the key), mode 0600 in the 0700 LB folder; written
        by the LB job from its environment at each start, never rendered."""
        return self.lb_dir / "auth.conf"

    @property
    def slurm_lock(self) -> Path:
        """Lock file serialising changes to the replica tasks (``up`` and the LB's reconciler)."""
        return self.root / "slurm.lock"

    def step_log(self, step_name: str) -> Path:
        """Log of a job step that has no job folder of its own."""
        return self.root / "steps" / f"{step_name}.log"

    def step_cancelled(self, step_id: str) -> Path:
        """Marker (Slurm): job step ``step_id`` (``123.4``) was stopped by a cancel."""
        return self.root / "steps" / f"{step_id}.cancelled"

    def batch_output(self, job: str, pattern: str, stream: str = "out") -> Path:
        """sbatch ``--output`` (``stream="out"``) or ``--error`` (``"err"``) of job ``job``
        (``replicas``, ``lb``) with Slurm's filename ``pattern``."""
        return self.root / f"{job}-{pattern}.{stream}"

    def job_dir(self, job_id: str) -> Path:
        """Folder of job ``job_id`` run on this swarm."""
        return self.root / "jobs" / job_id


class ShardPaths(Folder):
    """Files of one shard's ledger."""

    @property
    def parts_glob(self) -> str:
        """Glob matching committed part files."""
        return "part-*.parquet"

    def part(self, seq: int) -> Path:
        """Part file number ``seq``."""
        return self.root / f"part-{seq:06d}.parquet"

    def parts(self) -> list[Path]:
        """Committed part files, in order (temp files are never matched)."""
        return sorted(self.root.glob(self.parts_glob))

    @staticmethod
    def part_seq(part: Path) -> int:
        """The number of part file ``part`` (``part-000012.parquet`` -> 12)."""
        return int(part.stem.split("-")[1])

    def next_seq(self) -> int:
        """The number the next part file gets: one past the last committed part."""
        parts = self.parts()
        return self.part_seq(parts[-1]) + 1 if parts else 0

    def temp_files(self) -> list[Path]:
        """Temp files of atomic writes killed mid-write (never a committed file)."""
        return sorted(self.root.glob(f".*{TEMP_SUFFIX}"))

    @property
    def progress(self) -> Path:
        """Progress JSON (done, failed, total, tokens, rate)."""
        return self.root / "progress.json"

    @property
    def index(self) -> Path:
        """Progress index (JSON): rows done up to a position, the done rows past it, the error rows,
        and the first part it does not cover (what a resume reads instead of every part)."""
        return self.root / "index.json"

    @property
    def fingerprint(self) -> Path:
        """Fingerprint the ledger was written under."""
        return self.root / "fingerprint.json"

    @property
    def log(self) -> Path:
        """Job process log of this shard."""
        return self.root / "job.log"

    @property
    def done_marker(self) -> Path:
        """Present once the shard has finished every row."""
        return self.root / "DONE"

    @property
    def lock(self) -> Path:
        """Held (flock) by the one live job process of this shard; holds its pid."""
        return self.root / "shard.lock"

    @property
    def output_lock(self) -> Path:
        """Held (flock) while this shard's part of a dataset output is written."""
        return self.root / "output.lock"

    def output_record(self, token: str) -> Path:
        """The dataset part files (and counts) written for this shard's ledger state ``token``."""
        return self.root / f"output-{token}.json"

    def output_failed(self, token: str) -> Path:
        """The failed rows (JSONL: id, error) of this shard's ledger state ``token``."""
        return self.root / f"output-{token}-failed.jsonl"


class JobPaths(Folder):
    """Files of one job: spec, shard ledgers, manifest, failed rows."""

    @property
    def spec(self) -> Path:
        """The JobSpec as JSON (what the job process reads)."""
        return self.root / "spec.json"

    @property
    def manifest(self) -> Path:
        """Manifest written at commit (counts, tokens, timings, fingerprint)."""
        return self.root / "manifest.json"

    @property
    def failed_rows(self) -> Path:
        """Error rows listed at commit (JSONL: id, error)."""
        return self.root / "failed.jsonl"

    @property
    def validated(self) -> Path:
        """Stamp of the input identity whose ids were checked unique (skips re-checking)."""
        return self.root / "validated.json"

    @property
    def input_index(self) -> Path:
        """The input's metadata, read once per job: files, rows, schema, identity, JSONL line offsets."""
        return self.root / "input.json"

    @property
    def commit_lock(self) -> Path:
        """Lock file serialising commits of this job."""
        return self.root / "commit.lock"

    COMMIT_TMP_PREFIX = ".commit-buckets-"
    """Prefix of the temporary bucket folders a commit sorts one shard's ledger in."""

    def commit_tmp_dirs(self) -> list[Path]:
        """Bucket folders left by a commit that was killed mid-merge."""
        return sorted(self.root.glob(self.COMMIT_TMP_PREFIX + "*"))

    def own_files(self) -> list[Path]:
        """The job's own files at its top level (spec, manifest, failed rows, validation, input index,
        commit lock, launch record): what no output may be."""
        return [
            self.spec,
            self.manifest,
            self.failed_rows,
            self.validated,
            self.input_index,
            self.commit_lock,
            self.launch,
        ]

    def shards_root(self) -> Path:
        """Folder holding every shard's ledger."""
        return self.root / "shards"

    def shard(self, i: int) -> ShardPaths:
        """Ledger folder of shard ``i``."""
        return ShardPaths(self.root / "shards" / f"{i:05d}")

    def log(self, i: int) -> Path:
        """Process log of shard ``i`` (stdout+stderr)."""
        return self.root / "logs" / f"shard-{i:05d}.log"

    def exit_status(self, i: int) -> Path:
        """Exit status (JSON) of the process of shard ``i``, written by ``runtime.exitcode`` (local)."""
        return self.root / "logs" / f"shard-{i:05d}.exit.json"

    @property
    def launch(self) -> Path:
        """What a compute backend started for this job (JSON: pids, shards; local backend)."""
        return self.root / "launch.json"

    @classmethod
    def standalone(cls, job_id: str, base: Path | None = None) -> JobPaths:
        """Folder of job ``job_id`` when it belongs to no swarm: ``<home>/jobs/<job_id>``."""
        return cls((base or home_dir()) / "jobs" / job_id)


class PipelinePaths(Folder):
    """Files of one pipeline (``prefect_swarm.flows.pipeline``): each stage's committed output and the
    input handed to it (with the stamp of what that input was made from)."""

    @classmethod
    def for_pipeline(cls, pipeline_id: str, base: Path | None = None) -> PipelinePaths:
        """Folder of pipeline ``pipeline_id``: ``<home>/pipelines/<pipeline_id>``."""
        return cls((base or home_dir()) / "pipelines" / pipeline_id)

    def stage_output(self, i: int, name: str) -> Path:
        """What stage ``i`` (from 1) named ``name`` committed: its job's output."""
        return self.root / f"stage-{i}-{name}.parquet"

    def stage_input(self, i: int, name: str) -> Path:
        """The input handed to stage ``i`` by the stage before it (stage 1 reads the pipeline's input)."""
        return self.root / f"stage-{i}-{name}.input.parquet"

    def stamp(self, handed: str | Path) -> Path:
        """What the hand-over written to ``handed`` was made from (its source file's identity, the filter)."""
        return self.root / f"{Path(str(handed).rstrip('/')).name}.from.json"


class BatchServicePaths(Folder):
    """Files of the OpenAI-compatible batch service (:mod:`prefect_swarm.batchserver`): its database,
    the files clients upload and the service writes, and one work folder per batch. Every name here
    comes from an id the service generated, never from what a client sent."""

    @classmethod
    def for_home(cls, base: Path | None = None) -> BatchServicePaths:
        """The service's folder: ``<home>/batch-service`` (default ``$PREFECT_SWARM_HOME``)."""
        return cls((base or home_dir()) / "batch-service")

    @property
    def db(self) -> Path:
        """The service's SQLite database: tenants' hashed keys, files, batches."""
        return self.root / "service.db"

    @property
    def files(self) -> Path:
        """The folder of stored files (uploads and outputs), one per file id."""
        return self.root / "files"

    def file(self, file_id: str) -> Path:
        """The stored bytes of file ``file_id`` (a JSONL file; the suffix tells the job its format)."""
        return self.files / f"{file_id}.jsonl"

    def work(self, batch_id: str) -> Path:
        """Batch ``batch_id``'s work folder: the job's committed output before it is split."""
        return self.root / "work" / batch_id

    def committed(self, batch_id: str) -> Path:
        """Where batch ``batch_id``'s job writes its OpenAI Batch output (every line, in input order)."""
        return self.work(batch_id) / "output.jsonl"
