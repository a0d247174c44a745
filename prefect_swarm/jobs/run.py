"""The job process: ``python -m prefect_swarm.jobs.run --spec job.json --shard-id i --nshards n``.

Runs one shard of a job (see :mod:`prefect_swarm.jobs.shard`). Started by a compute backend
(local subprocess, ``srun`` step, Lepton job) or by hand. What the spec lacks comes from the
environment (the :class:`~prefect_swarm.interfaces.jobenv.JobEnv` contract): the endpoints, the
model, the API key, and the shard id / number of shards when the arguments are absent.
``--overwrite`` discards this shard's checkpoint first. Before any request the input and the
output location are checked (:func:`prefect_swarm.jobs.shard.validate_input`).

Exit codes:
    0   the shard is done (every row ok or an error row); the output is committed if it was the last
    1   the shard failed (an unexpected error; the log says why)
    2   bad input: spec, dataset (missing column, duplicate ids, an all-null prompt column...), output
        location (the input itself, inside the input folder, unwritable), or a checkpoint written
        with different settings (FingerprintMismatch): nothing was sent. Also an input file found
        damaged while streaming: the rows answered before it are kept in the ledger. Also another
        live process already runs this shard (its lock, ``shard.lock``, is held): nothing touched
    75  requeue (EX_TEMPFAIL): stopped by SIGTERM/SIGUSR1/SIGINT, by an outage of the swarm longer
        than ``outage_timeout_s`` (no endpoint answered), or at the swarm's budget (``budget``);
        finished rows were flushed (the progress file's ``stopped`` says why, the log names the
        command that resumes it) and a rerun resumes where this one stopped
"""

from __future__ import annotations

import argparse
import logging
import sys

from prefect_swarm.exceptions import ConfigError, FingerprintMismatch
from prefect_swarm.interfaces.jobenv import EXIT_BAD_INPUT, EXIT_FAILED, JobEnv
from prefect_swarm.jobs.shard import run_shard
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import private_umask

log = logging.getLogger("prefect_swarm.jobs")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (shard arguments fall back to the job environment's shard id / count)."""
    ap = argparse.ArgumentParser(
        prog="python -m prefect_swarm.jobs.run",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument("--spec", required=True, help="JobSpec JSON file")
    ap.add_argument("--shard-id", type=int, default=None)
    ap.add_argument("--nshards", type=int, default=None)
    ap.add_argument("--overwrite", action="store_true", help="discard this shard's checkpoint and start over")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one shard; return its exit code."""
    args = parse_args(argv)
    env = JobEnv.from_env()
    level = (env.log_level or "INFO").upper()
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    try:
        spec = JobSpec.load(args.spec)
        shard_id = _first(args.shard_id, env.shard_id, 0)
        nshards = _first(args.nshards, env.nshards, spec.shards)
        return run_shard(spec, shard_id, nshards, overwrite=args.overwrite)
    except (ConfigError, FingerprintMismatch) as exc:
        log.error("%s", exc)
        return EXIT_BAD_INPUT
    except Exception:
        log.exception("the shard failed")
        return EXIT_FAILED


def _first(*values: int | None) -> int:
    return next(v for v in values if v is not None)


if __name__ == "__main__":
    private_umask()  # the process entry point only: a test calling main() keeps its umask
    sys.exit(main())
