"""A loopback fake of the DGX Cloud Lepton workspace API that runs workloads as local processes.

    with FakeLepton() as fake:                       # free port, token, workspace 'ws-test'
        client = APIClient(workspace_id=fake.workspace_id, auth_token=fake.token, url=fake.url)
        ...                                          # the real leptonai SDK, end to end
    # every process it started is stopped

    python -m prefect_swarm.testing.fake_lepton [--port P] [--token T] [--workspace W]

Stdlib only (http.server). It serves the routes leptonai 0.47.1's ``APIClient`` uses, at the root
and under ``/api/v2/workspaces/<ws>`` (the gateway layout): ``/workspace``, ``/deployments``
(create, get, PATCH, delete, readiness, replicas, replica log, events), ``/jobs`` (create, get,
PATCH ``stopped``, delete, paged list with label query, replicas, log, events), ``/usersecrets``,
``/shapes``, ``/dedicated-node-groups`` and ``/imagepullsecrets``. Bearer auth on every route; a
wrong workspace id in the path is a 404.

Workloads are real processes:

- a deployment's container command is mapped to ``endpoint_command`` (default: the stub engine)
  on a free loopback port, with ``--served-model-name`` taken from the command and the endpoint
  token (``api_tokens``, literal or secret ref) passed as ``--api-key`` — the stub refuses other
  tokens, like Lepton's gateway. With ``run_endpoint_commands=True`` the container command runs
  as given instead (its container port and 0.0.0.0 replaced by a loopback port; the token in
  ``STUB_API_KEY``/``VLLM_API_KEY``). One process serves all of a deployment's replicas. The
  endpoint URL is that process's URL. ``Starting`` until its ``/health`` answers 200 (polled in
  the background), then ``Ready``; ``Error`` once it has exited.
- a job's container command runs as given, inside a job root that stands for its image: its
  ``PATH`` is only ``<root>/bin``, which holds ``python3`` (a shim that runs the interpreter the
  image maps to: ``images[image]``, by default ``python``) and a few shell tools, nothing of the
  worker's venv; the env is what the image sets (``PATH``, ``HOME``, a ``TMPDIR`` of its own inside
  the root) plus the spec's, nothing inherited from this process (no ``PYTHONPATH``, ``LANG``...);
  the working directory is an empty folder of its own. A command whose program the
  image lacks (``python``, an absolute path outside the image and the mounts) fails with exit code
  127, as the container runtime would; so does a job of an image ``images`` does not list. The
  spec's env (secret refs resolved) is passed; mounts are taken as local paths. ``Starting`` (first
  GET), ``Running``, then ``Completed``/``Failed`` by exit code; ``Stopped`` after PATCH stopped=true.

Knobs: :meth:`FakeLepton.inject` (the next N matching requests answer 503/429/...),
``fail_jobs`` (jobs whose name contains one of these exit 3 instead of running),
``fail_deployments`` (deployments whose name contains one of these go to ``Error``),
:meth:`FakeLepton.force_state` (pin a deployment's or job's state),
``new_deployment_api`` (the workspace feature ``enable_new_deployment_api``: endpoints then live
under ``/endpoints`` in the new HTTPEndpoint shape, one ``components`` entry holding container and
resources, no metadata labels (400), no ``/readiness`` route; the legacy ``/deployments`` routes
answer 400 on create and 404 otherwise), ``volumes`` (the workspace's volumes, ``from`` name ->
host folder standing for its root: a job sees ``<root>/<path>`` at ``mount_path``, its command
and env rewritten to match; a volume without a root, like the default ``node-nfs:lepton-shared-fs``,
is seen at ``mount_path`` as the worker sees it; an unknown ``from`` is a 400), ``latency_s``
(every authorized request waits this long before it is applied), ``queue_jobs`` (jobs whose
name contains one of these stay ``Queueing``, never scheduled), ``archive_after_s`` (a finished job
reads ``Archived`` with no counts this long after it finished, and 404 after twice that),
:meth:`FakeLepton.expire_token` (the token stops working, as Lepton tokens do after a day). A job
whose env names a secret the workspace lacks fails to start; a reserved or malformed env name is a 400;
so is a resource shape outside ``shapes`` (served at ``GET /shapes``), a node group id outside
``node_groups`` (id -> name, served with their volumes at ``GET /dedicated-node-groups``) and an
image-pull secret outside ``image_pull_secrets`` (``GET /imagepullsecrets``). ``queue_deployments``
(deployments whose name contains one of these are never scheduled: ``Not Ready``, readiness
``NoCapacity``, replicas without a node). ``restart_crashed``: a
deployment whose engine exits is restarted, as the platform does, its state ``Not Ready`` and each
crash listed at ``GET /deployments/<n>/termination`` and counted in a ``BackOff`` event (the new
API's only trace of it), instead of turning ``Error``.

Where the platform differs from what a client would assume, the fake does as the SDK's source
says (each cited next to its code): a job's id is the server's (``<name>-<hex>``) and a name may
be taken twice; a secret posted again replaces the old value; replica logs stream while the
process lives. Knobs for the rest: ``delete_s`` (deletes finish in the background: ``Deleting``,
then 404, the name refused with 409 until the delete is done), ``legacy_create_response`` (a
create answers 200 with an empty body, as old servers do), ``unknown_reads`` (a new or updated
deployment reads the unknown state ``""`` that many times), ``group_volumes`` / ``group_shapes``
(node group id -> its own volumes / shapes; default every group has all), ``malformed_node_groups``
(their catalog entry carries a volume the SDK's model refuses, so ``nodegroup.list_all`` skips it),
``pull_s`` (a job reads ``Starting``, no process yet, this long after its create: its image being
pulled), ``images`` values :data:`WITHOUT_PREFECT_SWARM` (an image like ``vllm/vllm-openai``: every
package of the worker's interpreter but prefect-swarm, fresh for each job).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prefect_swarm.backends.common import start_logged
from prefect_swarm.testing.stub_engine import engine_command

Reply = tuple[int, Any]

DELETE_S = 1.0
"""Default ``delete_s``: a delete finishes in the background, as on the platform (0 makes it instant)."""
UNKNOWN_READS = 2
"""Default ``unknown_reads``: a new or updated deployment reads the unknown state first, as on the platform."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _flag(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


@dataclass
class _Injection:
    status: int
    count: int
    match: str
    retry_after: float | None
    apply: bool = False
    method: str = ""


@dataclass
class _LogStream:
    """A replica's log, streamed: what the file holds, then what it gains while the process lives.

    leptonai 0.47.1 api/v2/job.py ``get_log``: "The log is streamed in chunks until timeout is
    reached. If timeout is not specified, the log will be streamed indefinitely". So a live
    replica's stream stays open (the SDK's read timeout then ends it: ``requests`` raises
    ConnectionError from ``iter_content``); a finished one's ends with its last line."""

    workload: _Workload
    fake: FakeLepton
    poll_s: float = 0.05

    def write(self, out: Any) -> None:
        """Write the stream to ``out`` (the socket file) as HTTP/1.1 chunks; a connection dropped by
        :meth:`FakeLepton.drop_log_streams` ends without the last chunk, as a cut connection does."""
        w, offset, generation = self.workload, 0, self.fake.stream_generation
        while True:
            if self.fake.stream_generation != generation:
                raise ConnectionResetError("the fake dropped the log stream")
            alive = w.alive()  # read before the file: what a finished process wrote is all there
            data = b""
            if w.log_path.exists():
                with w.log_path.open("rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            if data:
                offset += len(data)
                out.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                out.flush()
            if not alive:
                out.write(b"0\r\n\r\n")
                out.flush()
                return
            time.sleep(self.poll_s)


@dataclass
class _Workload:
    kind: str  # "deployment" | "job"
    body: dict[str, Any]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int | None = None
    gets: int = 0
    forced: str | None = None
    stopped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def min_replicas(self) -> int:
        """The replicas a deployment's spec asks for: one when unset; 0 once stopped (scaled to zero, as
        leptonai 0.47.1's ``deployment.stop`` asks: a PATCH of ``resource_requirement.min_replicas`` to 0)."""
        wanted = (self.body["spec"].get("resource_requirement") or {}).get("min_replicas")
        return 1 if wanted is None else int(wanted)

    def stop(self) -> None:
        """Terminate the process group (SIGTERM, then SIGKILL after 5 s)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


class FakeLepton:
    """The fake workspace: state, processes and an HTTP server on a free loopback port."""

    def __init__(
        self,
        *,
        token: str | None = None,
        workspace_id: str = "ws-test",
        port: int = 0,
        endpoint_command: list[str] | None = None,
        python: str = sys.executable,
        images: Mapping[str, str] | None = None,
        run_endpoint_commands: bool = False,
        fail_jobs: tuple[str, ...] = (),
        fail_deployments: tuple[str, ...] = (),
        workdir: Path | None = None,
        new_deployment_api: bool = False,
        volumes: Mapping[str, str | Path | None] | None = None,
        latency_s: float = 0.0,
        queue_jobs: tuple[str, ...] = (),
        archive_after_s: float | None = None,
        shapes: tuple[str, ...] | None = None,
        restart_crashed: bool = False,
        node_groups: Mapping[str, str] | None = None,
        image_pull_secrets: tuple[str, ...] = (),
        queue_deployments: tuple[str, ...] = (),
        delete_s: float = DELETE_S,
        legacy_create_response: bool = False,
        unknown_reads: int = UNKNOWN_READS,
        group_volumes: Mapping[str, tuple[str, ...]] | None = None,
        group_shapes: Mapping[str, tuple[str, ...]] | None = None,
        malformed_node_groups: tuple[str, ...] = (),
        pull_s: float = 0.0,
    ) -> None:
        self.token = token or "fake-lepton-" + secrets.token_hex(12)
        self.workspace_id = workspace_id
        self.endpoint_command = endpoint_command or engine_command(host="127.0.0.1")
        self.python = python
        self.images = dict(images) if images is not None else None
        self.run_endpoint_commands = run_endpoint_commands
        self.fail_jobs = tuple(fail_jobs)
        self.fail_deployments = tuple(fail_deployments)
        self.new_deployment_api = new_deployment_api
        self.latency_s = latency_s
        self.queue_jobs = tuple(queue_jobs)
        self.archive_after_s = archive_after_s
        self.shapes = tuple(shapes) if shapes is not None else SHAPES
        self.restart_crashed = restart_crashed
        self.node_groups: dict[str, str] = dict(node_groups) if node_groups is not None else dict(NODE_GROUPS)
        self.image_pull_secrets = tuple(image_pull_secrets)
        self.queue_deployments = tuple(queue_deployments)
        self.delete_s = delete_s
        self.legacy_create_response = legacy_create_response
        self.unknown_reads = unknown_reads
        self.group_volumes = dict(group_volumes) if group_volumes is not None else None
        self.group_shapes = dict(group_shapes) if group_shapes is not None else None
        self.malformed_node_groups = tuple(malformed_node_groups)
        self.pull_s = pull_s
        self.stream_generation = 0
        self._name_free_at: dict[str, float] = {}
        self.job_logs: dict[str, Path] = {}  # job id -> its log: the historical logs outlive the job
        self.volumes: dict[str, Path | None] = (
            {name: None if root is None else Path(root) for name, root in volumes.items()}
            if volumes is not None
            else {DEFAULT_VOLUME: None}
        )
        self.lock = threading.RLock()
        self.deployments: dict[str, _Workload] = {}
        self.jobs: dict[str, _Workload] = {}
        self.secrets: dict[str, str] = {}
        self.requests: list[tuple[str, str, int]] = []
        self._injections: list[_Injection] = []
        self._expired: set[str] = set()
        self._tmp = tempfile.TemporaryDirectory(prefix="fake-lepton-") if workdir is None else None
        self.workdir = Path(self._tmp.name) if self._tmp else Path(workdir)  # type: ignore[arg-type]
        self._server = _make_server(self, port)
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        """The port the API listens on."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Workspace API URL to give the SDK (gateway layout: ``.../api/v2/workspaces/<ws>``)."""
        return f"http://127.0.0.1:{self.port}/api/v2/workspaces/{self.workspace_id}"

    def start(self) -> FakeLepton:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-lepton", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop every process this fake started, then the server."""
        with self.lock:
            for w in [*self.deployments.values(), *self.jobs.values()]:
                w.stop()
        self._server.shutdown()
        self._server.server_close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> FakeLepton:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ knobs and views
    def inject(
        self,
        status: int = 503,
        count: int = 1,
        match: str = "",
        retry_after: float | None = 0,
        apply: bool = False,
        method: str = "",
    ) -> None:
        """Answer the next ``count`` requests whose path contains ``match`` (and whose verb is
        ``method``, when given) with ``status``; with ``apply`` the request takes effect first (a
        gateway timing out on a call that went through)."""
        with self.lock:
            self._injections.append(_Injection(status, count, match, retry_after, apply, method.upper()))

    def expire_token(self) -> str:
        """The current token expires (every later request with it answers 401); returns a new one."""
        with self.lock:
            self._expired.add(self.token)
            self.token = "fake-lepton-" + secrets.token_hex(12)
            return self.token

    def age_finished_jobs(self, seconds: float) -> None:
        """Every finished job reads as if it had finished ``seconds`` earlier: past ``archive_after_s``
        it is ``Archived``, past twice that gone (a test moves the platform's clock instead of sleeping).
        A job that ended but was not read since has its end recorded first (:meth:`_job_state` does)."""
        with self.lock:
            for w in self.jobs.values():
                self._job_state(w)
                if "finished_at" in w.extra:
                    w.extra["finished_at"] -= seconds

    def drop_log_streams(self) -> None:
        """Cut every replica log stream open now (the platform drops long streams: leptonai 0.47.1's
        ``get_log`` says not to rely on one lasting)."""
        with self.lock:
            self.stream_generation += 1

    def force_state(self, name: str, state: str | None) -> None:
        """Pin the state of deployment or job ``name`` (None: back to the process-driven state)."""
        with self.lock:
            target = self.deployments.get(name) or self.jobs.get(name)
            if target is None:
                raise KeyError(name)
            target.forced = state

    def wait_deletes(self, timeout_s: float = 20.0) -> None:
        """Return once every delete started so far has finished in the background (each object then
        answers 404 and its name is free again), as a user waits for ``lep`` to stop listing it;
        :class:`~prefect_swarm.testing.waiting.WaitTimedOut` after ``timeout_s``, naming what is left."""
        from prefect_swarm.testing.waiting import wait_until

        wait_until(
            "the fake's deletes to finish",
            self._deletes_left,
            until=lambda left: not left,
            timeout_s=timeout_s,
            poll_s=0.05,
        )

    def _deletes_left(self) -> list[str]:
        with self.lock:
            self._sweep()
            pending = [n for t in (self.deployments, self.jobs) for n, w in t.items() if "gone_at" in w.extra]
            return pending or [str(n) for n in self._name_free_at]

    def running_processes(self) -> list[int]:
        """PIDs of deployment and job processes still alive."""
        with self.lock:
            return [
                w.proc.pid
                for w in [*self.deployments.values(), *self.jobs.values()]
                if w.proc is not None and w.alive()
            ]

    def job_env(self, job_id: str) -> dict[str, str]:
        """The env a job's process got (for tests)."""
        return dict(self.jobs[job_id].extra.get("env", {}))

    # ------------------------------------------------------------------ dispatch
    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any, headers: Any) -> Reply:
        """One request -> (status, JSON-able payload or text)."""
        m = re.match(r"^/api/v2/workspaces/([^/]+)(/.*)?$", path)
        if m:
            if m.group(1) != self.workspace_id:
                return 404, {"code": "not_found", "message": f"workspace {m.group(1)} not found"}
            path = m.group(2) or "/"
        auth = str(headers.get("Authorization") or "")
        if auth.removeprefix("Bearer ") in self._expired:
            return 401, {"code": "unauthorized", "message": "token expired"}
        if auth != f"Bearer {self.token}":
            return 401, {"code": "unauthorized", "message": "invalid or expired token"}
        if self.latency_s:  # the API's own time, spent before the request is applied (not under the lock)
            time.sleep(self.latency_s)
        with self.lock:
            self._sweep()
            for inj in self._injections:
                if inj.count > 0 and inj.match in path and inj.method in ("", method):
                    inj.count -= 1
                    if inj.apply:
                        self._route(method, path, query, body or {})
                    return inj.status, {
                        "code": "injected",
                        "message": f"injected HTTP {inj.status}",
                        "_retry_after": inj.retry_after,
                    }
            return self._route(method, path, query, body or {})

    def _sweep(self) -> None:
        """Forget workloads whose background delete has finished (see :meth:`_delete_deployment`)."""
        now = time.time()
        for table in (self.deployments, self.jobs):
            for name, w in list(table.items()):
                if w.extra.get("gone_at", now + 1) <= now:
                    del table[name]
        for name, free_at in list(self._name_free_at.items()):
            if free_at <= now:
                del self._name_free_at[name]

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Reply:
        if path == "/workspace" and method == "GET":
            return 200, self._workspace_info()
        for pattern, fn in self._routes():
            m = re.match(pattern, f"{method} {path}")
            if m:
                return fn(*m.groups(), query=query, body=body)
        named = re.match(r"^(\w+) /(deployments|endpoints|jobs)/([^/]+)(/.*)?$", f"{method} {path}")
        if named and (named.group(2) == "endpoints") is not self.new_deployment_api and named.group(2) != "jobs":
            named = None  # each workspace serves endpoints through one API only
        if named:  # a route on one workload: 404 unless it exists
            verb, kind, name, rest = named.groups()
            table = self.jobs if kind == "jobs" else self.deployments
            if name not in table:
                return 404, {"code": "not_found", "message": f"{kind[:-1]} {name} not found"}
            route = f"{verb} {re.sub(r'/replicas/[^/]+/', '/replicas/*/', rest or '/')}"
            handler = self._workload_routes(kind).get(route)
            if handler is not None:
                return handler(name, table[name], query=query, body=body)
        return 404, {"code": "not_found", "message": f"no route {method} {path}"}

    def _routes(self) -> list[tuple[str, Callable[..., Reply]]]:
        return [
            (r"^GET /deployments$", lambda **kw: (200, [self._dep_json(n) for n in list(self.deployments)])),
            (r"^POST /deployments$", self._create_deployment),
            (r"^GET /endpoints$", self._list_endpoints),
            (r"^POST /endpoints$", self._create_endpoint),
            (r"^GET /jobs$", self._list_jobs),
            (r"^POST /jobs$", self._create_job),
            (r"^GET /shapes$", self._shapes_json),
            (r"^GET /dedicated-node-groups$", lambda **kw: (200, self._node_groups_json())),
            (
                r"^GET /imagepullsecrets$",
                lambda **kw: (200, [{"metadata": {"name": n}, "spec": {}} for n in self.image_pull_secrets]),
            ),
            (r"^GET /logs$", self._historical_logs),
            (r"^GET /usersecrets$", lambda **kw: (200, [{"name": k} for k in sorted(self.secrets)])),
            (r"^POST /usersecrets$", self._create_secrets),
            (r"^DELETE /usersecrets/([^/]+)$", self._delete_secret),
        ]

    def _workload_routes(self, kind: str) -> dict[str, Callable[..., Reply]]:
        """``VERB /rest`` -> handler(name, workload) of one existing deployment or job."""
        shared: dict[str, Callable[..., Reply]] = {
            "GET /replicas": lambda n, w, **kw: (200, self._replicas_json(n, w)),
            "GET /replicas/*/log": lambda n, w, **kw: (200, _LogStream(w, self)),
            "GET /events": lambda n, w, **kw: (200, self._events(w)),
        }
        own: dict[str, Callable[..., Reply]]
        if kind == "deployments":
            own = {
                "GET /": self._get_deployment,
                "PATCH /": self._patch_deployment,
                "DELETE /": self._delete_deployment,
                "GET /readiness": self._readiness,
                "GET /termination": self._termination,
            }
        elif kind == "endpoints":  # the new API has no /readiness: readiness is per replica
            own = {
                "GET /": lambda n, w, **kw: (200, self._endpoint_json(n)),
                "PATCH /": self._patch_endpoint,
                "DELETE /": self._delete_deployment,
            }
        else:
            own = {"GET /": self._get_job, "PATCH /": self._patch_job, "DELETE /": self._delete_job}
        return {**shared, **own}

    def _replicas_json(self, name: str, w: _Workload) -> list[dict[str, Any]]:
        """A workload's replicas; one not scheduled (queued for capacity) has no node. An archived job
        has none left: its log is then served only by the historical ``GET /logs``."""
        if name in self.jobs and self._job_state(w) == "Archived":
            return []
        rid = f"{name}-replica-0"
        status = {} if w.extra.get("queued") else {"node": {"name": "node-0", "id": "node-0"}}
        return [{"id": rid, "metadata": {"id": rid, "name": rid}, "status": status}]

    def _group_has_volume(self, ng: str, source: str) -> bool:
        return self.group_volumes is None or source in self.group_volumes.get(ng, ())

    def _group_shapes(self, ng: str) -> tuple[str, ...]:
        return self.shapes if self.group_shapes is None else tuple(self.group_shapes.get(ng, ()))

    def _node_groups_json(self) -> list[dict[str, Any]]:
        """The node groups, each with its own volume list ("each node group has its own Node Local
        Volume list", Lepton's docs; ``group_volumes``, default: every named volume on every group).
        A group in ``malformed_node_groups`` lists a volume without ``size_in_gb``, which leptonai
        0.47.1's ``Volume`` model requires: its ``ensure_list`` (api/v2/api_resource.py) then skips
        the whole group with only a "[lepton-error] Skipped ..." line on stderr."""
        out = []
        for ng, name in sorted(self.node_groups.items()):
            volumes: list[dict[str, Any]] = []
            for source in sorted(self.volumes):
                kind, sep, vname = source.partition(":")
                if kind.startswith("node-") and sep and vname and self._group_has_volume(ng, source):
                    volumes.append({"from": kind.removeprefix("node-"), "name": vname, "size_in_gb": 1024})
            if ng in self.malformed_node_groups:
                volumes.append({"from": "nfs", "name": "scratch-without-size"})
            out.append(
                {"metadata": {"id": ng, "name": name}, "spec": {"volumes": volumes}, "status": {"ready_nodes": 1}}
            )
        return out

    def _shapes_json(self, *, query: dict[str, list[str]], **_: Any) -> Reply:
        """Resource shapes per node group (leptonai 0.47.1 api/v2/resource_shape.py ``list_shapes``
        filters by ``node_groups``, documented as a node group *name*, and ``purpose``; types/shape.py
        gives each a ``spec.name`` and ``spec.node_group_id``; cli/node.py names a shape by
        ``spec.name`` first and keeps those whose ``listable_in`` holds the purpose). The id is the
        server's, not the name."""
        wanted = query.get("node_groups")
        purpose = next(iter(query.get("purpose") or []), None)
        out = []
        for ng in sorted(self.node_groups):
            if wanted and self.node_groups[ng] not in wanted:
                continue  # "node_group: Optional node group name filter": an id matches nothing
            for shape in self._group_shapes(ng):
                listable = ["pod", "deployment", "job"]
                if purpose and purpose not in listable:
                    continue
                sid = "shp-" + hashlib.sha256(f"{ng}/{shape}".encode()).hexdigest()[:10]
                spec = {"name": shape, "node_group_id": ng, "listable_in": listable}
                out.append({"metadata": {"id": sid}, "spec": spec})
        return 200, out

    def _workspace_info(self) -> dict[str, Any]:
        zero = {"cpu": 0.0, "memory": 0, "accelerator_num": 0.0}
        return {
            "build_time": "2026-01-01T00:00:00Z",
            "git_commit": "0.0.0-fake",
            "workspace_name": self.workspace_id,
            "workspace_tier": "enterprise",
            "workspace_state": "normal",
            "supported_shapes": {},
            "workspace_disk_usage_bytes": 0,
            "workloads": {
                "num_deployments": len(self.deployments),
                "num_jobs": len(self.jobs),
                "num_pods": 0,
                "num_secrets": len(self.secrets),
                "num_image_pull_secrets": len(self.image_pull_secrets),
            },
            "resource_quota": {"limit": zero, "used": zero},
            # true: the SDK sends endpoints to /endpoints in the new (HTTPEndpoint) shape
            "features": {"enable_new_deployment_api": self.new_deployment_api},
        }

    # ------------------------------------------------------------------ deployments
    def _create_deployment(self, *, body: Any, **_: Any) -> Reply:
        if self.new_deployment_api:  # what the api-server does with a legacy create when the flag is on
            return 400, {
                "code": "bad_request",
                "message": "this workspace uses the new endpoint API: create endpoints through /endpoints",
            }
        md = body.get("metadata") or {}
        name = md.get("name") or md.get("id")
        if not name:
            return 400, {"code": "bad_request", "message": "metadata.name is required"}
        if name in self.deployments or name in self._name_free_at:
            return 409, {"code": "conflict", "message": f"deployment {name} already exists"}
        problem = self._spec_problem(body.get("spec") or {})
        if problem:
            return 400, {"code": "bad_request", "message": problem}
        self._add_deployment(name, md, body.get("spec") or {})
        return 200, {} if self.legacy_create_response else self._dep_json(name)

    def _add_deployment(self, name: str, md: dict[str, Any], spec: dict[str, Any]) -> _Workload:
        w = _Workload(
            "deployment",
            {"metadata": {**md, "id": name, "name": name, "created_at": _now_ms(), "version": 1}, "spec": spec},
            self.workdir / f"deployment-{name}.log",
        )
        w.extra["unknown_reads"] = self.unknown_reads
        self.deployments[name] = w
        self._start_deployment(w)
        return w

    def _start_deployment(self, w: _Workload) -> None:
        name = w.body["metadata"]["name"]
        if w.min_replicas() == 0:  # stopped: scaled to zero, nothing runs until it is scaled up again
            return
        if any(s in name for s in self.queue_deployments):
            w.extra["queued"] = True  # no capacity for its shape: its replicas wait unscheduled
            return
        if any(s in name for s in self.fail_deployments):
            w.extra["error"] = "injected failure: the container exited with code 1"
            return
        spec = w.body["spec"]
        container = spec.get("container") or {}
        command = container.get("command") or []
        w.port = w.port or _free_port()  # a deployment keeps its URL across restarts and scaling, as on the platform
        key = self._endpoint_token(spec)
        # the engine runs on this machine in place of the endpoint image: it keeps the host's basics
        env = self._env(spec, {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ})
        if self.run_endpoint_commands:  # as given, on a loopback port instead of the container port
            ports = {str(p.get("container_port")) for p in container.get("ports") or []}
            argv = [str(w.port) if a in ports else "127.0.0.1" if a == "0.0.0.0" else a for a in command]
            if argv and argv[0] in ("python", "python3"):
                argv[0] = self.python
            if key:  # the gateway's check, done by the engine: the stub and vLLM read these (under /v1
                # only, as vLLM does: the platform's health check reaches the container without it)
                env.update(STUB_API_KEY=key, VLLM_API_KEY=key, STUB_KEY_SCOPE="v1")
        else:
            subs = {
                "python": self.python,
                "host": "127.0.0.1",
                "port": str(w.port),
                "model": _flag(command, "--model", "--model-path") or "model",
                "served_model_name": _flag(command, "--served-model-name") or name,
            }
            argv = [part.format(**subs) for part in self.endpoint_command]
            if key:  # the platform's own health check reaches the container without the token, as it
                # reaches a vLLM started with --api-key (which guards /v1 only); the gateway guards the rest
                argv += ["--api-key", key, "--key-scope", "v1"]
        w.proc = self._spawn(argv, env, w.log_path)
        threading.Thread(target=self._watch_health, args=(w, w.proc), daemon=True).start()

    def _watch_health(self, w: _Workload, proc: subprocess.Popen[bytes]) -> None:
        """Poll the process's /health off the request path, so API calls never wait on an engine."""
        while proc.poll() is None and w.proc is proc and not w.extra.get("ready"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{w.port}/health", timeout=1) as resp:
                    w.extra["ready"] = resp.status == 200
            except OSError:
                pass
            time.sleep(0.1)

    def _endpoint_token(self, spec: dict[str, Any]) -> str | None:
        for tok in spec.get("api_tokens") or []:
            if tok.get("value"):
                return str(tok["value"])
            ref = (tok.get("value_from") or {}).get("token_name_ref")
            if ref:
                return self.secrets.get(ref, "missing-secret-" + ref)
        return None

    def _dep_state(self, w: _Workload) -> str:
        if w.forced:
            return w.forced
        if "gone_at" in w.extra:
            return "Deleting"
        if w.min_replicas() == 0:
            return "Stopped"
        if w.extra.get("unknown_reads", 0) > 0:
            # "Backend represents the unknown state as an empty string" (leptonai 0.47.1,
            # api/v2/types/deployment.py LeptonDeploymentState): a just-created or updated
            # deployment reads so a few times before the controller has looked at it
            w.extra["unknown_reads"] -= 1
            return ""
        if w.extra.get("queued"):
            return "Not Ready"
        if self.restart_crashed and (w.extra.get("error") or not w.alive()):
            self._record_crash(w)
            return "Not Ready"  # the platform restarts it (with back-off): the state never says Error
        if w.extra.get("error"):
            return "Error"
        if not w.alive():
            return "Error"
        return "Ready" if w.extra.get("ready") else "Starting"

    def _record_crash(self, w: _Workload) -> None:
        """A crashed replica: a termination record, then a restart (at most every 0.2 s)."""
        now = time.time()
        if now - w.extra.get("last_crash", 0.0) < 0.2:
            return
        w.extra["last_crash"] = now
        code = (w.proc.returncode if w.proc is not None else None) or 1
        tail = w.log_path.read_text(errors="replace")[-500:] if w.log_path.exists() else ""
        term = {
            "started_at": int(w.extra.get("started_at", now)),
            "finished_at": int(now),
            "exit_code": code,
            "reason": "Error",
            "message": (tail or w.extra.get("error") or "").strip(),
        }
        w.extra.setdefault("terminations", []).append(term)
        if not w.extra.get("error"):
            w.extra.pop("ready", None)
            self._start_deployment(w)

    def _events(self, w: _Workload) -> list[dict[str, Any]]:
        """A workload's events (Kubernetes events: leptonai 0.47.1 api/v2/types/events.py, whose
        ``regarding`` is a corev1.ObjectReference). Restarts of a crashed container show as the
        kubelet's ``BackOff`` event, its count one per restart: the only trace of a crash loop on the
        new Endpoint API, which has no termination route (api/v2/endpoint.py ``get_termination``)."""
        if w.kind == "deployment":
            self._dep_state(w)  # records a crash that happened since the last read
        crashes = len(w.extra.get("terminations", []))
        if not crashes:
            return [_EVENT]
        return [_EVENT, {**_EVENT, "type": "Warning", "reason": "BackOff", "count": crashes}]

    def _termination(self, name: str, w: _Workload, **_: Any) -> Reply:
        self._dep_state(w)
        return 200, {f"{name}-replica-0": list(w.extra.get("terminations", []))}

    def _dep_json(self, name: str) -> dict[str, Any]:
        w = self.deployments[name]
        url = f"http://127.0.0.1:{w.port}" if w.port else f"http://127.0.0.1:9/{name}"
        status = {
            "state": self._dep_state(w),
            "endpoint": {"internal_endpoint": f"http://{name}.default.svc:8080", "external_endpoint": url},
        }
        return {**w.body, "status": status}

    def _get_deployment(self, name: str, w: _Workload, **_: Any) -> Reply:
        w.gets += 1
        return 200, self._dep_json(name)

    def _patch_deployment(self, name: str, w: _Workload, *, body: Any, **_: Any) -> Reply:
        new = _merge(w.body["spec"], body.get("spec") or {})
        problem = self._spec_problem(new)
        if problem:
            return 400, {"code": "bad_request", "message": problem}
        labels = (body.get("metadata") or {}).get("labels")
        if labels:  # a merge patch of the object: the metadata's labels merge too
            w.body["metadata"]["labels"] = {**(w.body["metadata"].get("labels") or {}), **labels}
        self._apply_spec(w, new)
        return 200, self._dep_json(name)

    def _apply_spec(self, w: _Workload, new: dict[str, Any]) -> None:
        """A changed spec is a new version: its replicas restart."""
        if new != w.body["spec"]:
            w.body["spec"] = new
            w.body["metadata"]["version"] = int(w.body["metadata"].get("version") or 1) + 1
            w.stop()
            w.extra.pop("ready", None)
            self._start_deployment(w)

    # ------------------------------------------------------------------ endpoints (the new API)
    def _create_endpoint(self, *, body: Any, **_: Any) -> Reply:
        if not self.new_deployment_api:
            return 404, {"code": "not_found", "message": "no route POST /endpoints"}
        md = body.get("metadata") or {}
        name = md.get("name")
        spec = body.get("spec") or {}
        problem = _endpoint_problem(md, spec) or self._spec_problem(_endpoint_to_legacy(spec))
        if problem or not name:
            return 400, {"code": "bad_request", "message": problem or "metadata.name is required"}
        if name in self.deployments or name in self._name_free_at:
            return 409, {"code": "conflict", "message": f"endpoint {name} already exists"}
        w = self._add_deployment(name, {}, _endpoint_to_legacy(spec))
        w.extra["endpoint_spec"] = spec
        return 200, {} if self.legacy_create_response else self._endpoint_json(name)

    def _patch_endpoint(self, name: str, w: _Workload, *, body: Any, **_: Any) -> Reply:
        md = body.get("metadata") or {}
        spec = _merge_rfc7386(w.extra.get("endpoint_spec") or {}, body.get("spec") or {})
        problem = _endpoint_problem(md, spec) or self._spec_problem(_endpoint_to_legacy(spec))
        if problem:
            return 400, {"code": "bad_request", "message": problem}
        w.extra["endpoint_spec"] = spec
        self._apply_spec(w, _endpoint_to_legacy(spec))
        return 200, self._endpoint_json(name)

    def _list_endpoints(self, **_: Any) -> Reply:
        if not self.new_deployment_api:
            return 404, {"code": "not_found", "message": "no route GET /endpoints"}
        return 200, [self._endpoint_json(n) for n in list(self.deployments)]

    def _endpoint_json(self, name: str) -> dict[str, Any]:
        """An endpoint as the new API shows it (HTTPEndpoint): no labels, no internal URL."""
        w = self.deployments[name]
        state = self._dep_state(w)
        n = w.min_replicas()
        status: dict[str, Any] = {
            "state": {"Not Ready": "NotReady"}.get(state, state),
            "external_url": f"http://127.0.0.1:{w.port}" if w.port else f"http://127.0.0.1:9/{name}",
        }
        if state == "Ready":
            status["ready_replicas"] = n
        md = w.body["metadata"]
        meta = {"name": name, "created_at": md["created_at"], "version": md.get("version", 1)}
        if "gone_at" in w.extra:  # how this API says Deleting (leptonai 0.47.1 api/v2/translation.py)
            meta["deleted_at"] = _now_ms()
        return {
            "metadata": meta,
            "spec": w.extra.get("endpoint_spec") or {},
            "status": status,
        }

    def _delete_deployment(self, name: str, w: _Workload, **_: Any) -> Reply:
        """With ``delete_s``, as the platform: the call only starts the delete. leptonai 0.47.1's
        cli/deployment.py ``_create_after_new_api_rerun``: "Endpoint and DevPod deletion return after
        initiating CR deletion. An immediate create can therefore receive 409 from the old CR or
        dependent resources." So the deployment reads ``Deleting`` (the new API: ``metadata.deleted_at``,
        api/v2/translation.py) for the first half of ``delete_s``, then 404, while a create of its name
        answers 409 for the whole of it."""
        if self.delete_s <= 0:
            self.deployments.pop(name).stop()
            return 200, {}
        if "gone_at" not in w.extra:
            w.stop()
            now = time.time()
            w.extra["gone_at"] = now + self.delete_s / 2
            self._name_free_at[name] = now + self.delete_s
        return 200, {}

    def _readiness(self, name: str, w: _Workload, **_: Any) -> Reply:
        state = self._dep_state(w)
        reason = {"Ready": "Ready", "Error": "SystemError"}.get(state, "InProgress")
        message = w.extra.get("error") or ("" if reason == "Ready" else f"deployment is {state}")
        if w.extra.get("queued") and not w.forced:
            shape = (w.body["spec"].get("resource_requirement") or {}).get("resource_shape")
            reason, message = "NoCapacity", f"no node has capacity for resource shape {shape}; queued"
        n = w.min_replicas()
        item = {"reason": reason, "message": message, "creationTimestamp": "2026-01-01T00:00:00Z"}
        return 200, {f"{name}-replica-{i}": [item] for i in range(n)}

    # ------------------------------------------------------------------ jobs
    def _create_job(self, *, body: Any, **_: Any) -> Reply:
        md = body.get("metadata") or {}
        name = md.get("name") or md.get("id")
        if not name or not re.fullmatch(r"[a-z][a-z0-9-]{0,35}", name):
            return 400, {"code": "bad_request", "message": f"invalid job name {name!r}"}
        problem = self._spec_problem(body.get("spec") or {})
        if problem:
            return 400, {"code": "bad_request", "message": problem}
        # Job names are not unique on the platform and the id is the server's: leptonai 0.47.1's
        # cli/job.py sends ``Metadata(id=name)`` and reports ``created_job.metadata.id_`` as the new
        # job's ID; cli/util.py ``_get_newest_job_by_name`` picks the newest of the jobs sharing a
        # name ("lep job remove --name" removes only the newest). So a second create of a name makes
        # a second job (no 409), and every later route takes the id this answer returns.
        jid = f"{name}-{secrets.token_hex(3)}"
        while jid in self.jobs:
            jid = f"{name}-{secrets.token_hex(3)}"
        w = _Workload(
            "job",
            {
                "metadata": {**md, "id": jid, "name": name, "created_at": _now_ms()},
                "spec": body.get("spec") or {},
            },
            self.workdir / f"job-{jid}.log",
        )
        w.extra["created"] = time.time()
        self.jobs[jid] = w
        if self.pull_s > 0:  # its image is pulled first: ``Starting`` until then, no process yet
            w.extra["pulling"] = True
            timer = threading.Timer(self.pull_s, self._pulled, args=(w,))
            timer.daemon = True
            timer.start()
        else:
            self._start_job(w)
        return 200, self._job_json(jid)

    def _pulled(self, w: _Workload) -> None:
        with self.lock:
            live = not w.stopped and "gone_at" not in w.extra and w.body["metadata"]["id"] in self.jobs
            if w.extra.pop("pulling", False) and live:
                self._start_job(w)

    def _start_job(self, w: _Workload) -> None:
        spec = w.body["spec"]
        container = spec.get("container") or {}
        argv = list(container.get("command") or [])
        if any(s in w.body["metadata"]["id"] for s in self.queue_jobs):
            w.extra["queued"] = True  # no capacity: it waits for nodes that never free up
            return
        if any(s in w.body["metadata"]["id"] for s in self.fail_jobs):
            argv = ["python3", "-c", "import sys; print('injected job failure', flush=True); sys.exit(3)"]
        env = self._env(spec)
        w.extra["env"] = env
        missing = sorted(self._missing_secrets(spec))
        if missing:  # the pod cannot start: its env names a secret the workspace lacks
            w.log_path.write_text(f"CreateContainerConfigError: secret {missing[0]!r} not found\n")
            w.extra["exit"] = 1
            return
        if not argv:
            w.extra["exit"] = 0
            return
        seen = self._mounted(spec)
        argv = [_remap(a, seen) for a in argv]
        env = {k: _remap(v, seen) for k, v in env.items()}
        jid = w.body["metadata"]["id"]
        try:
            image = self._image_root(str(container.get("image") or ""), jid)
            argv[0] = _resolve(argv[0], image, [src for _mp, src in seen])
            if (
                len(argv) > 4
                and argv[1] == "-c"
                and argv[2].endswith('exec "$@"')
                and os.path.basename(argv[0]) == "sh"
            ):
                # a setup wrapper (``sh -c '<setup> && exec "$@"' sh PROGRAM ...``): the container's
                # shell would find PROGRAM in the image too, or fail the exec
                argv[4] = _resolve(argv[4], image, [src for _mp, src in seen])
        except LookupError as exc:  # what the container runtime reports, and the job fails
            w.log_path.write_text(f"{exc}\n")
            w.extra["exit"] = 127
            return
        # what the image sets, under the spec's env; no variable of the worker's environment
        tmp, cwd = image / "tmp" / jid, image / "work" / jid  # this job's own /tmp and empty working dir
        tmp.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        env = {"PATH": str(image / "bin"), "HOME": str(image / "root"), "TMPDIR": str(tmp), **env}
        w.extra["env"] = env
        self.job_logs[jid] = w.log_path
        w.proc = self._spawn(argv, env, w.log_path, cwd=cwd)

    def _spec_problem(self, spec: dict[str, Any]) -> str | None:
        """What the API refuses in a spec: an unknown volume, a relative mount path, public access
        together with tokens (None: fine)."""
        shape = spec.get("resource_shape") or (spec.get("resource_requirement") or {}).get("resource_shape")
        affinity = spec.get("affinity") or (spec.get("resource_requirement") or {}).get("affinity") or {}
        pinned = list(affinity.get("allowed_dedicated_node_groups") or [])
        for ng in pinned:
            if ng not in self.node_groups:
                return f"affinity.allowed_dedicated_node_groups: unknown node group id {ng!r}"
        groups = pinned or sorted(self.node_groups)
        if shape and not any(shape in self._group_shapes(ng) for ng in groups):
            return f"resource_shape: unknown shape {shape!r} on node groups {groups}"
        for secret in spec.get("image_pull_secrets") or []:
            if secret not in self.image_pull_secrets:
                return f"image_pull_secrets: unknown image pull secret {secret!r}"
        if spec.get("allow_unauthenticated_access") is True and spec.get("api_tokens"):
            return "allow_unauthenticated_access=true cannot be combined with api_tokens"
        for var in spec.get("envs") or []:
            name = str(var.get("name") or "")
            if not re.fullmatch(r"[A-Za-z_.-][A-Za-z0-9_.-]*", name) or name in RESERVED_ENV_NAMES:
                return f"envs: {name!r} is not a usable environment variable name (reserved or malformed)"
        return self._mount_problem(spec, groups)

    def _mount_problem(self, spec: dict[str, Any], groups: list[str]) -> str | None:
        """An unknown volume, one no node group the spec may use has, or a relative path (None: fine)."""
        for i, m in enumerate(spec.get("mounts") or []):
            source = m.get("from") or DEFAULT_VOLUME
            if source not in self.volumes:
                return f"mounts[{i}].from: unknown volume {source!r} (the workspace has {sorted(self.volumes)})"
            if ":" in source and not any(self._group_has_volume(ng, source) for ng in groups):
                return f"mounts[{i}].from: no node group of {groups} has volume {source!r}"
            if not str(m.get("mount_path") or "").startswith("/") or not str(m.get("path") or "").startswith("/"):
                return f"mounts[{i}]: path and mount_path must be absolute paths"
        return None

    def _mounted(self, spec: dict[str, Any]) -> list[tuple[str, str]]:
        """(mount_path, host folder the job sees there) of each mount: the volume's ``path`` under
        the volume's root; a volume without a root is seen at its mount_path as the worker sees it."""
        out = []
        for m in spec.get("mounts") or []:
            root = self.volumes.get(m.get("from") or DEFAULT_VOLUME)
            mount_path = os.path.normpath(str(m["mount_path"]))
            src = mount_path if root is None else str(root / str(m["path"]).lstrip("/"))
            if root is not None:
                Path(src).mkdir(parents=True, exist_ok=True)
            out.append((mount_path, src))
        return out

    def _image_root(self, image: str, jid: str) -> Path:
        """The job root standing for ``image``: ``bin/python3`` runs the interpreter the image maps to.
        An image mapped to :data:`WITHOUT_PREFECT_SWARM` gets a root of its own per job (a container
        starts from its image: what one job installs, the next does not have)."""
        python = self.python if self.images is None else self.images.get(image)
        if python is None:
            raise LookupError(f"failed to pull image {image!r}: not found (the fake knows {sorted(self.images or {})})")
        root = self.workdir / "images" / re.sub(r"[^A-Za-z0-9_.-]+", "_", image or "default")
        if python == WITHOUT_PREFECT_SWARM:
            root = root / "containers" / jid
            python = self._bare_python(root / "venv")
        if not (root / "bin" / "python3").exists():
            (root / "bin").mkdir(parents=True, exist_ok=True)
            (root / "root").mkdir(exist_ok=True)
            shim = root / "bin" / "python3"
            shim.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "$@"\n')
            shim.chmod(0o755)
            for tool in _IMAGE_TOOLS:
                found = shutil.which(tool, path="/usr/bin:/bin")
                if found:
                    (root / "bin" / tool).symlink_to(found)
        return root

    def _bare_python(self, venv: Path) -> str:
        """A fresh virtual environment that sees every package of this interpreter but prefect-swarm
        (through a ``.pth`` naming a folder of links to them), with no pip of its own but theirs."""
        deps = self.workdir / "images" / "site-without-prefect-swarm"
        if not deps.exists():
            import sysconfig

            tmp = deps.with_name(deps.name + ".tmp")
            tmp.mkdir(parents=True, exist_ok=True)
            for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
                name = entry.name.lower()
                if name.startswith(("prefect_swarm", "__editable__", "prefect-swarm")) or name.endswith(".pth"):
                    continue
                (tmp / entry.name).symlink_to(entry)
            tmp.rename(deps)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        purelib = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        (Path(purelib) / "image-packages.pth").write_text(f"{deps}\n")
        return str(venv / "bin" / "python")

    def _job_state(self, w: _Workload) -> str:
        if w.forced:
            return w.forced
        if "gone_at" in w.extra:
            return "Deleting"
        if w.extra.get("queued"):
            return "Stopped" if w.stopped else "Queueing"
        if w.extra.get("pulling"):
            return "Stopped" if w.stopped else "Starting"
        if w.stopped:
            state = "Stopping" if w.alive() else "Stopped"
        elif w.gets <= 1 and w.alive():
            return "Starting"
        elif w.alive():
            return "Running"
        else:
            code = w.proc.returncode if w.proc is not None else w.extra.get("exit", 0)
            state = "Completed" if code == 0 else "Failed"
        if state != "Stopping":
            finished = w.extra.setdefault("finished_at", time.time())
            if self.archive_after_s is not None and time.time() - finished >= self.archive_after_s:
                return "Archived"  # past ttl_seconds_after_finished: its counts are gone too
        return state

    def _job_json(self, jid: str) -> dict[str, Any]:
        w = self.jobs[jid]
        state = self._job_state(w)
        done = state in ("Completed", "Failed", "Stopped")
        status = {
            "job_name": jid,
            "state": state,
            "ready": int(state == "Running"),
            "active": int(state in ("Running", "Starting", "Stopping")),
            "failed": int(state == "Failed"),
            "succeeded": int(state == "Completed"),
            "creation_time": int(w.extra["created"]),
            "completion_time": int(time.time()) if done else None,
            "job_history": [],
        }
        return {**w.body, "status": status}

    def _get_job(self, jid: str, w: _Workload, **_: Any) -> Reply:
        w.gets += 1
        finished = w.extra.get("finished_at")
        if self.archive_after_s is not None and finished and time.time() - finished >= 2 * self.archive_after_s:
            del self.jobs[jid]  # out of the archive too
            return 404, {"code": "not_found", "message": f"job {jid} not found"}
        return 200, self._job_json(jid)

    def _patch_job(self, jid: str, w: _Workload, *, body: Any, **_: Any) -> Reply:
        if (body.get("spec") or {}).get("stopped") is True and self._job_state(w) not in (
            "Completed",
            "Failed",
        ):
            w.stopped = True
            w.stop()
        return 200, self._job_json(jid)

    def _delete_job(self, jid: str, w: _Workload, **_: Any) -> Reply:
        """With ``delete_s`` the job reads ``Deleting`` that long, then 404 (see _delete_deployment)."""
        if self.delete_s <= 0:
            self.jobs.pop(jid).stop()
        elif "gone_at" not in w.extra:
            w.stop()
            w.extra["gone_at"] = time.time() + self.delete_s
        return 200, {}

    def _historical_logs(self, *, query: dict[str, list[str]], **_: Any) -> Reply:
        """``GET /logs?job=ID&start=NS&end=NS``: a job's log lines between two epoch-ns times, kept after
        the job is archived and gone. leptonai 0.47.1 api/v2/log.py ``LogAPI.get_log`` sends these
        parameters (both ``start`` and ``end`` for history, else 400 from the SDK itself) and the
        answer is Loki's shape, ``data.result[].{stream, values: [[ts_ns, line], ...]}``, as its CLI
        (cli/log.py) parses it. Times here are the log file's: every line of a job at its mtime."""
        job = (query.get("job") or [""])[0]
        path = self.job_logs.get(job)
        if path is None:
            return 404, {"code": "not_found", "message": f"no logs of job {job!r}"}
        start, end = (int((query.get(k) or ["0"])[0]) for k in ("start", "end"))
        ts = int(path.stat().st_mtime * 1e9) if path.exists() else 0
        lines = path.read_text(errors="replace").splitlines() if path.exists() and start <= ts <= end else []
        values = [[str(ts + k), line] for k, line in enumerate(lines)]
        return 200, {"status": "success", "data": {"result": [{"stream": {"job": job}, "values": values}]}}

    def _list_jobs(self, *, query: dict[str, list[str]], **_: Any) -> Reply:
        items = [self._job_json(j) for j in sorted(self.jobs)]
        for selector in query.get("query", []):
            key, _sep, value = selector.partition("=")
            items = [j for j in items if (j["metadata"].get("labels") or {}).get(key) == value]
        for q in query.get("q", []):  # "substring match for job name" (the SDK's job.py list_all)
            items = [j for j in items if q in j["metadata"]["name"]]
        page = int((query.get("page") or ["1"])[0])
        size = int((query.get("page_size") or ["50"])[0])
        return 200, {"jobs": items[(page - 1) * size : page * size]}

    # ------------------------------------------------------------------ secrets, env, processes
    def _create_secrets(self, *, body: Any, **_: Any) -> Reply:
        """Nothing in the SDK or docs shows the API refusing an existing secret name: leptonai 0.47.1's
        own ``lep secret create`` (cli/secret.py) lists the secrets and refuses an existing name
        itself before it posts. So this fake takes the post as the platform may: the value replaced."""
        for item in body if isinstance(body, list) else []:
            self.secrets[item["name"]] = item.get("value") or ""
        return 200, {}

    def _delete_secret(self, name: str, **_: Any) -> Reply:
        if self.secrets.pop(name, None) is None:
            return 404, {"code": "not_found", "message": f"secret {name} not found"}
        return 200, {}

    def _missing_secrets(self, spec: dict[str, Any]) -> set[str]:
        refs = {(var.get("value_from") or {}).get("secret_name_ref") for var in spec.get("envs") or []}
        return {ref for ref in refs if ref and ref not in self.secrets}

    def _env(self, spec: dict[str, Any], base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A container's env: ``base`` (what the image sets), then the spec's values and resolved
        secret refs. Nothing of this process's environment unless ``base`` holds it."""
        env = dict(base or {})
        for var in spec.get("envs") or []:
            ref = (var.get("value_from") or {}).get("secret_name_ref")
            env[var["name"]] = self.secrets.get(ref, "") if ref else str(var.get("value") or "")
        return env

    def _spawn(
        self, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        return start_logged(argv, env, log_path, cwd)


WITHOUT_PREFECT_SWARM = "<without-prefect-swarm>"
"""An ``images`` value: the image's ``python3`` has every package of the worker's interpreter but
prefect-swarm (like ``vllm/vllm-openai``), and each job gets a fresh copy: a job that needs it must
install it in its own setup, every time."""

RESERVED_ENV_NAMES = frozenset(
    {
        "LEPTON_WORKSPACE_ID",
        "LEPTON_DEPLOYMENT_NAME",
        "LEPTON_JOB_NAME",
        "LEPTON_RESOURCE_ACCELERATOR_TYPE",
        "LEPTON_WORKSPACE_ORIGIN_URL",
    }
)
"""Env names Lepton sets itself (leptonai 0.47.1's ``LEPTON_RESERVED_ENV_NAMES``)."""
SHAPES = (
    "cpu.small",
    "cpu.medium",
    "cpu.large",
    "gpu.a10",
    "gpu.a100-80gb",
    "gpu.h100-sxm",
    "gpu.2xh100-sxm",
    "gpu.4xh100-sxm",
    "gpu.8xh100-sxm",
)
"""Resource shapes the fake workspace has unless ``shapes`` says otherwise (from the SDK's list)."""
NODE_GROUPS = {"ng-7f3a9c": "default-pool"}
"""The fake's node groups unless ``node_groups`` says otherwise (id -> name; the API takes ids)."""
DEFAULT_VOLUME = "node-nfs:lepton-shared-fs"
"""The volume a workspace has unless ``volumes`` says otherwise."""


def _remap(text: str, mounted: list[tuple[str, str]]) -> str:
    """``text`` with each mount_path (as a whole path prefix) replaced by the folder mounted there."""
    for mount_path, src in mounted:
        if src != mount_path:
            pattern = r"(?<![^\s'\"=:])" + re.escape(mount_path) + r"(?=/|$|[\s'\":])"
            text = re.sub(pattern, src.replace("\\", "\\\\"), text)
    return text


_IMAGE_TOOLS = ("sh", "env", "cat", "sleep", "true", "false")
"""Shell tools every fake image has besides ``python3``."""


def _resolve(program: str, image: Path, mounts: list[str]) -> str:
    """``program`` as the container would find it: on the image's PATH, or an absolute path inside
    the image or a mount. LookupError (exit 127 in a real container) otherwise."""
    if "/" not in program:
        found = shutil.which(program, path=str(image / "bin"))
        if found:
            return found
        raise LookupError(
            f"exec: {program!r}: executable file not found in $PATH (the image has {(*_IMAGE_TOOLS, 'python3')})"
        )
    inside = [str(image), *(m for m in mounts if m)]
    if any(os.path.normpath(program).startswith(root.rstrip("/") + "/") for root in inside) and os.access(
        program, os.X_OK
    ):
        return program
    raise LookupError(f"exec: {program!r}: no such file or directory in the image")


def _endpoint_problem(md: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """What the new endpoint API refuses in a create or patch body (None: nothing)."""
    if md.get("labels"):
        return "metadata.labels: the endpoint API has no labels"
    comps = spec.get("components")
    if not isinstance(comps, list) or not comps or not all(isinstance(c, dict) and c.get("name") for c in comps):
        return "spec.components: a non-empty list of named components is required"
    return None


def _endpoint_to_legacy(spec: dict[str, Any]) -> dict[str, Any]:
    """The legacy deployment spec an HTTPEndpoint spec stands for (its frontend component)."""
    comps = spec["components"]
    comp = next((c for c in comps if c.get("frontend") is True), comps[0])
    rr = {k: comp[k] for k in ("resource_shape", "min_replicas", "max_replicas", "affinity") if k in comp}
    out: dict[str, Any] = {
        "container": {k: comp[k] for k in ("image", "command", "ports") if k in comp},
        "resource_requirement": rr,
    }
    for key in ("envs", "mounts"):
        if key in comp:
            out[key] = comp[key]
    for key in ("api_tokens", "allow_unauthenticated_access", "image_pull_secrets"):
        if key in spec:
            out[key] = spec[key]
    return out


def _merge_rfc7386(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch: null deletes, objects merge, anything else (lists too) replaces."""
    out = dict(old)
    for key, value in new.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            current = out.get(key)
            out[key] = _merge_rfc7386(current if isinstance(current, dict) else {}, value)
        else:
            out[key] = value
    return out


_EVENT = {"type": "Normal", "reason": "Scheduled", "count": 1, "last_observed_time": "2026-01-01T00:00:00Z"}


def _merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch of a spec (what Lepton's PATCH does)."""
    out = dict(old)
    for key, value in new.items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def _make_server(fake: FakeLepton, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # the SDK's traffic is not worth a line each
            pass

        def _do(self) -> None:
            url = urlsplit(self.path)
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            status, payload = fake.handle(self.command, url.path, parse_qs(url.query), body, self.headers)
            fake.requests.append((self.command, url.path, status))
            if isinstance(payload, _LogStream):  # streamed outside the lock, until the process ends
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    payload.write(self.wfile)
                except OSError:  # the client stopped reading (its read timeout)
                    self.close_connection = True
                return
            extra = {}
            if isinstance(payload, dict) and "_retry_after" in payload:
                after = payload.pop("_retry_after")
                if after is not None:
                    extra["Retry-After"] = f"{after:g}"
            if isinstance(payload, str):
                data, ctype = payload.encode(), "text/plain"
            else:
                data, ctype = json.dumps(payload).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _do

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    return srv


def main(argv: list[str] | None = None) -> None:
    """Serve a fake workspace until SIGINT/SIGTERM; print its URL, workspace id and token."""
    ap = argparse.ArgumentParser(description="A loopback fake of the DGX Cloud Lepton workspace API.")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token", default=None, help="bearer token to accept (default: a random one, printed)")
    ap.add_argument("--workspace", default="ws-test")
    ap.add_argument(
        "--endpoint-command",
        default=None,
        help="command template for deployments ({python} {port} {model} {served_model_name})",
    )
    a = ap.parse_args(argv)
    fake = FakeLepton(
        token=a.token,
        workspace_id=a.workspace,
        port=a.port,
        endpoint_command=shlex.split(a.endpoint_command) if a.endpoint_command else None,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with fake:
        print(json.dumps({"url": fake.url, "workspace_id": fake.workspace_id, "token": fake.token}), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()


if __name__ == "__main__":
    main()
