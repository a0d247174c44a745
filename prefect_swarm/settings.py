"""Runtime knobs, all under the ``PREFECT_SWARM_`` environment prefix: the one place they are read.

These are process-wide settings (where state lives, log level), not swarm configuration: a
swarm is described by :class:`prefect_swarm.config.SwarmConfig` (whose fields a
``PREFECT_SWARM_<FIELD>`` variable overrides, :func:`prefect_swarm.config.loader.env_overrides`).
The variables the control plane writes for the processes it starts (the shard, the endpoints, the
API key) are a process protocol, not knobs: :data:`prefect_swarm.interfaces.jobenv.PROTOCOL`.
Tests set these through the environment, never by patching module globals; :func:`get_settings`
reads the environment on every call so a changed variable takes effect at once. The table of them
in the docs (``docs/reference/settings.md``) is generated from this class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from prefect_swarm.exceptions import ConfigError

ENV_PREFIX = "PREFECT_SWARM_"
"""The prefix of every variable prefect-swarm reads."""


class Settings(BaseSettings):
    """Process-wide settings read from ``PREFECT_SWARM_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    home: Path = Field(
        default=Path("~/.prefect-swarm"),
        description="Folder holding state.db, defaults.yaml and one folder per swarm and job.",
    )
    log_level: str = Field(default="INFO", description="Log level of the CLI and the job process.")
    state_journal: Literal["auto", "wal", "delete"] = Field(
        default="auto",
        description="SQLite journal of the state database: 'auto' uses WAL on a local filesystem and a "
        "rollback journal (DELETE) on a network one (NFS, CIFS, Lustre, GPFS, BeeGFS, FUSE...), where "
        "SQLite documents WAL as unsafe; 'wal' or 'delete' forces one.",
    )
    busy_timeout_ms: int = Field(
        default=30_000, ge=0, description="SQLite busy timeout for the state database, in milliseconds."
    )
    prefect_api_timeout_s: float = Field(
        default=5.0, gt=0, description="Timeout for Prefect API calls made to show run history."
    )
    progress_every_s: float = Field(
        default=3.0,
        gt=0,
        description="Seconds between two updates of a flow run's job progress artifact (each reads the "
        "shards' small progress files, never the input) and two looks at a swarm's readiness while a "
        "run waits for it (a line is logged when a replica's health changes).",
    )
    progress_log_every_s: float = Field(
        default=15.0,
        gt=0,
        description="Seconds between two progress lines a flow run logs for each running job (rows, "
        "rows/s, time left, $ so far).",
    )
    result_storage: str | None = Field(
        default=None,
        description="Where flows persist their results: a saved Prefect filesystem block's slug "
        "('local-file-system/NAME', 's3-bucket/NAME'...); default: HOME/prefect-results.",
    )

    cache: bool = Field(
        default=False,
        description="Use the response cache across jobs by default: a job's answers are kept (keyed on the "
        "swarm's engine fingerprint and the exact request) and a later identical request is answered from it "
        "without being sent. A job's own cache option (--cache / --no-cache, JobSpec.cache) wins.",
    )
    cache_dir: Path | None = Field(
        default=None,
        description="Folder of the response cache (one SQLite database, responses.db); default HOME/cache. "
        "The job processes open it: it must be a path they reach (on Slurm, a shared filesystem).",
    )
    cache_max_gb: float = Field(
        default=20.0,
        gt=0,
        description="Size bound of the response cache in GB (10^9 bytes): past it the answers used least "
        "recently are dropped.",
    )

    commit_bucket_rows: int = Field(
        default=200_000,
        ge=1,
        description="Rows of one bucket at most when a job's shards are merged into its output: the rows the "
        "commit holds in memory at once (fewer when rows are wide).",
    )
    lepton_api_backoff_s: float = Field(
        default=0.5,
        gt=0,
        description="First delay in seconds between tries of a Lepton API call that failed transiently "
        "(HTTP 429, 5xx, a lost connection); it doubles each try, up to 10 s.",
    )

    @property
    def cache_folder(self) -> Path:
        """The response cache's folder, with ``~`` expanded."""
        return (self.cache_dir or self.home / "cache").expanduser()

    @property
    def home_dir(self) -> Path:
        """The home folder, with ``~`` expanded."""
        return self.home.expanduser()

    @property
    def state_db(self) -> Path:
        """Path of the SQLite state database."""
        return self.home_dir / "state.db"

    @property
    def defaults_file(self) -> Path:
        """Path of the user's defaults file (lowest-precedence config after built-ins)."""
        return self.home_dir / "defaults.yaml"


def get_settings() -> Settings:
    """Read the settings from the environment now; a bad value is a ConfigError naming the variable."""
    try:
        return Settings()
    except ValidationError as exc:
        bad = "; ".join(
            f"{ENV_PREFIX}{'_'.join(str(p) for p in e['loc']).upper()}={e.get('input')!r}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"{bad}. Fix or unset the variable (docs: Reference, Settings).") from None
