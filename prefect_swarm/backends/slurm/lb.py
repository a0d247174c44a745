"""The LB reconciler: keeps nginx's upstream list equal to the replicas that are alive.

    python -m prefect_swarm.backends.slurm.lb --swarm-dir DIR [--nginx-bin nginx] [--public node:port] [--once]
        [--replicas-job-name NAME] [--parent PID --nginx-pid PID]

Runs inside the Slurm LB job next to ``nginx -g 'daemon off;'``. Every ``--interval`` seconds:

1. read the replicas' head files (``replica-<i>.head``: ``node:port``, written while healthy);
2. drop a replica whose port refuses connections ``STRIKES`` checks in a row (its head file can
   outlive it when the task was SIGKILLed or its node died);
3. when the set changed: write ``upstreams.conf`` atomically, ``nginx -t``, then ``nginx -s reload``.
   A config nginx rejects is logged and the running config stays. The same replicas go to
   ``targets.json``, the Prometheus file_sd list of their engines' ``/metrics``.

Before nginx starts (``--once``) it writes ``lb/auth.conf`` (mode 0600): the nginx ``map`` that
refuses a request without ``Authorization: Bearer <key>`` (the key from this job's environment,
``PREFECT_SWARM_API_KEY``; no key: an open endpoint, nothing refused). Its own checks send the key.

Host names are resolved to IPv4 here: nginx would otherwise also try ``::1`` for ``localhost``.
With no replica alive the upstream holds one placeholder marked ``down`` (an empty upstream block
is a config error), so the LB answers 502 until a replica comes back.
Once nginx answers ``/nginx-health``, it writes ``lb.head`` (``--public``) for clients to find it.

With ``--replicas-job-name``, every ``REPLENISH_S`` seconds a replica task that left the queue is
resubmitted on its own (:func:`members.replenish`, with this job's environment, which carries the
swarm's secrets), unless its engine failed (the watchdog gave up). With ``--parent``, when the LB
script is gone (killed outright), nginx (``--nginx-pid``) is stopped and the reconciler exits:
nginx never outlives its job. With ``--idle-timeout S`` (``backend.idle_timeout_s``) it stops the
swarm after S seconds without a request (:mod:`.idle`). With ``--budget COST`` (``backend.cost`` with a
cap) it holds the swarm to its budget while the swarm runs, job or no job: every ``BUDGET_CHECK_S`` it
reads the swarm's GPU-hours from sacct (:func:`.accounting.swarm_gpu_hours`, the figure ``gpu_usage``
reports), warns in its log at 80 % and past the cap stops the swarm with the reason, as the idle
timeout does. TERM, INT and USR1 stop the reconciler.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prefect_swarm.backends.common import host_port
from prefect_swarm.backends.slurm import accounting, members
from prefect_swarm.backends.slurm.client import SlurmClient, clean_env
from prefect_swarm.backends.slurm.idle import IdleWatch, idle_snapshot
from prefect_swarm.exceptions import BudgetReached
from prefect_swarm.interfaces.jobenv import API_KEY, BEARER_TOKEN, env_value
from prefect_swarm.interfaces.metrics import engine_targets, write_file_sd
from prefect_swarm.paths import SwarmPaths, atomic_write_text, private_umask, read_json, read_text

if TYPE_CHECKING:
    from prefect_swarm.budget import BudgetGuard

log = logging.getLogger("prefect_swarm.lb")

STRIKES = 2
"""Failed connection checks in a row after which a replica leaves the upstream list."""

PLACEHOLDER = "server 127.0.0.1:9 down;  # no replica alive\n"

REPLENISH_S = 10.0
"""How often the reconciler looks for replica tasks that left the queue (one squeue call): with
``members.KEEP_LB_S``, an idle swarm asks Slurm 12 times a minute, not more, for its whole life."""


def read_heads(paths: SwarmPaths) -> dict[int, str]:
    """Replica index -> ``host:port`` from the head files present now."""
    heads = {i: read_text(path) for i, path in paths.replica_heads().items()}
    return {i: text for i, text in heads.items() if text}


def resolve(hostport: str) -> str | None:
    """``host:port`` -> ``ipv4:port``; None when it does not parse or resolve."""
    parsed = host_port(hostport)
    if parsed is None:
        return None
    try:
        return f"{socket.gethostbyname(parsed[0])}:{parsed[1]}"
    except OSError:
        return None


def accepts(addr: str, timeout_s: float = 2.0) -> bool:
    """True when ``ip:port`` accepts a TCP connection (a busy engine still accepts; a dead one refuses)."""
    parsed = host_port(addr)
    if parsed is None:
        return False
    try:
        with socket.create_connection(parsed, timeout=timeout_s):
            return True
    except OSError:
        return False


def render_auth(key: str | None) -> str:
    """auth.conf: the map ``$psw_refused`` nginx.conf checks first; 1 unless the request carries
    ``Authorization: Bearer <key>`` exactly (a regex map: nginx's plain map strings ignore case).
    No key: 0 for every request (``backend.open_endpoint``)."""
    if not key:
        return "map $http_authorization $psw_refused { default 0; }  # open endpoint: no key\n"
    if not BEARER_TOKEN.match(key):  # validate refuses such an api_key first; never echo it
        raise ValueError(f"${API_KEY} is not a bearer token (RFC 6750 b64token); the LB cannot check it")
    pattern = "^Bearer " + "".join(f"[{c}]" if c in ".+" else c for c in key) + "$"
    return f'map $http_authorization $psw_refused {{\n    default 1;\n    "~{pattern}" 0;\n}}\n'


def write_auth(path: Path, key: str | None) -> None:
    """Write :func:`render_auth` to ``path``, mode 0600 from its first byte (it holds the key)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(render_auth(key))
    os.replace(tmp, path)


def auth_header(key: str | None) -> bytes:
    """The ``Authorization`` header line (CRLF-terminated) the LB's own checks send; empty without a key."""
    return f"Authorization: Bearer {key}\r\n".encode() if key else b""


def render_upstreams(servers: Sequence[str]) -> str:
    """The upstream include: one ``server`` line per ``ip:port``."""
    if not servers:
        return PLACEHOLDER
    return "".join(f"server {s} max_fails=1 fail_timeout=10s;\n" for s in sorted(servers))


@dataclass
class Reconciler:
    """Upstream file <- head files, with nginx -t and reload on change."""

    paths: SwarmPaths
    nginx: list[str]
    public: str | None = None
    strikes: dict[str, int] = field(default_factory=dict)
    current: str | None = None
    announced: bool = False
    engines: dict[int, str] = field(default_factory=dict)
    """Replica index -> ``ip:port`` of the replicas alive at the last pass (the metrics targets)."""

    @property
    def upstreams(self) -> Path:
        """The include nginx reads its servers from."""
        return self.paths.upstreams

    def alive(self) -> list[str]:
        """Addresses of replicas with a head file that did not refuse ``STRIKES`` checks in a row."""
        out, self.engines = [], {}
        for index, head in sorted(read_heads(self.paths).items()):
            addr = resolve(head)
            if addr is None:
                log.warning("replica %d: head %r does not resolve; skipped", index, head)
                continue
            self.strikes[addr] = 0 if accepts(addr) else self.strikes.get(addr, 0) + 1
            if self.strikes[addr] < STRIKES:
                out.append(addr)
                self.engines[index] = addr
        return out

    def step(self, reload: bool = True) -> bool:
        """One pass; True when the upstream file changed."""
        text = render_upstreams(self.alive())
        targets = engine_targets(self.paths.root.name, self.engines.items())
        if read_json(self.paths.metrics_targets) != targets.to_file_sd():
            write_file_sd(self.paths.metrics_targets, targets)
        if self.current is None and self.upstreams.exists():
            self.current = self.upstreams.read_text()
        if text == self.current:
            self.announce()
            return False
        previous = self.current
        atomic_write_text(self.upstreams, text)
        self.current = text
        log.info("upstreams now: %s", text.strip().replace("\n", " | "))
        if reload and not self.reload() and previous is not None:
            atomic_write_text(self.upstreams, previous)
            self.current = previous
        self.announce()
        return True

    def reload(self) -> bool:
        """``nginx -t`` then ``nginx -s reload``; False (logged) when either fails."""
        for extra in (["-t", "-q"], ["-s", "reload"]):
            proc = subprocess.run([*self.nginx, *extra], capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                log.error("nginx %s failed (%d): %s", " ".join(extra), proc.returncode, proc.stderr.strip())
                return False
        return True

    def announce(self) -> None:
        """Write ``lb.head`` once nginx answers its own health location."""
        if self.announced or not self.public or not self._nginx_up():
            return
        atomic_write_text(self.paths.lb_head, self.public + "\n")
        self.announced = True
        log.info("LB up at %s", self.public)

    def _nginx_up(self) -> bool:
        addr = resolve(self.public or "")
        parsed = host_port(addr) if addr else None
        if parsed is None:
            return False
        try:
            with socket.create_connection(parsed, timeout=2) as sock:
                sock.sendall(b"GET /nginx-health HTTP/1.0\r\n" + auth_header(env_value(API_KEY)) + b"\r\n")
                return sock.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False


_WARNED: set[int] = set()
"""Task indices last reported as not resubmitted (logged once, not every pass)."""


def replenish(paths: SwarmPaths, name: str, client: SlurmClient) -> list[int]:
    """Resubmit the replica tasks that left the queue (not those whose engine failed)."""
    record = read_json(paths.slurm_record, {}) or {}
    per = int(record.get("per_task") or 1)
    with members.locked(paths):
        failed = {
            i // per
            for i in range(int(record.get("replicas") or 0))
            if (read_json(paths.replica_status(i), {}) or {}).get("failed")
        }
        if failed != _WARNED:
            log.warning("replica task(s) %s: engine failed; not resubmitted (`up` does)", sorted(failed))
            _WARNED.clear()
            _WARNED.update(failed)
        return members.replenish(client, paths, name, clean_env(), skip=failed)


BUDGET_CHECK_S = 5.0
"""How often the LB job reads the swarm's GPU-hours (one sacct call) for its budget."""


def lb_guard(paths: SwarmPaths, client: SlurmClient, cost_json: str | None, gres_name: str) -> BudgetGuard | None:
    """The LB job's hold on the swarm's budget (``--budget``: its ``backend.cost`` as JSON) on its sacct
    GPU-hours, or None without one."""
    if not cost_json:
        return None
    from prefect_swarm.budget import BudgetGuard  # its pydantic models: only with a budget
    from prefect_swarm.config.cost import CostConfig

    def usage() -> tuple[float, None]:
        return accounting.swarm_gpu_hours(client, paths, gres_name), None

    return BudgetGuard(paths.root.name, CostConfig.model_validate_json(cost_json), usage, every_s=BUDGET_CHECK_S)


def stop_reason(idle: IdleWatch | None, budget: BudgetGuard | None, engines: dict[int, str]) -> str | None:
    """Why the swarm stops itself now (past its budget, or idle for ``idle_timeout_s``), or None."""
    if budget is not None:
        try:
            budget.check()
        except BudgetReached as exc:
            return f"{exc}: the LB job stopped the swarm (backend.cost)"
    if idle is not None and idle.expired(engines):
        return idle.reason()
    return None


def stop_nginx(pid: int | None) -> None:
    """QUIT nginx (graceful), if it still runs."""
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGQUIT)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description="Keep nginx's upstreams equal to the live replicas.")
    ap.add_argument("--swarm-dir", required=True, type=Path)
    ap.add_argument("--nginx-bin", default="nginx")
    ap.add_argument("--public", default=None, help="node:port clients reach the LB at (written to lb.head)")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument(
        "--once", action="store_true", help="write auth.conf and the upstream file once, no reload, and exit"
    )
    ap.add_argument("--replicas-job-name", default=None, help="resubmit replica tasks of this name that left")
    ap.add_argument("--parent", type=int, default=None, help="exit (stopping nginx) when this process is gone")
    ap.add_argument("--nginx-pid", type=int, default=None, help="nginx master to stop when the parent is gone")
    ap.add_argument("--idle-timeout", type=float, default=None, help="stop the swarm after this many idle seconds")
    ap.add_argument("--idle-park", action="store_true", help="park the idle swarm (keep its snapshot), not stop it")
    ap.add_argument("--budget", default=None, help="backend.cost (JSON) with a cap: stop the swarm past it")
    ap.add_argument("--gres-name", default="gpu", help="the GPUs' gres name in sacct's AllocTRES")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    paths = SwarmPaths(args.swarm_dir)
    nginx = [args.nginx_bin, "-c", str(paths.nginx_conf), "-e", str(paths.lb_error_log)]
    rec = Reconciler(paths, nginx, public=args.public)
    if args.once:
        try:
            write_auth(paths.lb_auth_conf, env_value(API_KEY))
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        atomic_write_text(rec.upstreams, render_upstreams(rec.alive()))
        return 0
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda signum, _f: stop.append(signum))
    client = SlurmClient(timeout_s=30.0)
    next_replenish = time.monotonic() + REPLENISH_S
    idle = IdleWatch(args.idle_timeout, env_value(API_KEY), park=args.idle_park) if args.idle_timeout else None
    budget = lb_guard(paths, client, args.budget, args.gres_name)
    while not stop:
        if args.parent and os.getppid() != args.parent:
            log.error("the LB script (pid %d) is gone: stopping nginx", args.parent)
            stop_nginx(args.nginx_pid)
            return 1
        try:
            rec.step()
            if args.replicas_job_name and time.monotonic() >= next_replenish:
                next_replenish = time.monotonic() + REPLENISH_S
                replenish(paths, args.replicas_job_name, client)
                stopped = (read_json(paths.slurm_record, {}) or {}).get("stopped")  # by replenish (members)
                if stopped:
                    log.error("the swarm was stopped: %s", stopped.get("reason"))
                    return 0  # the LB script stops nginx and ends the job
            why = stop_reason(idle, budget, rec.engines) if args.replicas_job_name else None
            if why:
                with members.locked(paths):
                    if idle is not None and idle.park and why == idle.reason():
                        idle_snapshot(paths, why).write(paths)  # before the stop: its jobs read it as a pause
                    members.stop_swarm(client, paths, args.replicas_job_name, why)
                return 0  # the LB script stops nginx and ends the job
        except Exception:  # one bad pass (a racing file, a slow nginx) must not take the LB down
            log.exception("reconcile pass failed; retrying")
        time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    private_umask()  # the process entry point only: a test calling main() keeps its umask
    sys.exit(main())
