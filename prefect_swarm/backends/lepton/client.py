"""Talks to a DGX Cloud Lepton workspace through the leptonai SDK; maps its errors in one place.

Everything the Lepton serving and compute backends send to the workspace goes through
:class:`LeptonClient`, which

- imports the SDK lazily (``import leptonai`` costs ~0.5 s and is an optional extra); a missing
  SDK is a ConfigError carrying the install hint;
- resolves the workspace token (``backend.token``, else ``$<token_env>``) and never logs it;
- retries what is transient (HTTP 429/502/503/504, connection errors) with exponential backoff
  that honours ``Retry-After`` (tenacity);
- translates every other failure with :func:`map_lepton_error`, the one place that knows what a
  Lepton HTTP status means for the user.

It also holds the small pure helpers both backends use to build SDK specs (env, mounts,
affinity), so the two specs cannot drift.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import RetryCallState, retry, retry_if_exception, stop_after_attempt

from prefect_swarm.exceptions import BackendError, ConfigError, PrefectSwarmError
from prefect_swarm.interfaces import jobenv
from prefect_swarm.settings import get_settings

if TYPE_CHECKING:
    from prefect_swarm.config import LeptonConfig
    from prefect_swarm.paths import SwarmPaths

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "pip install '.[lepton]' && pip install --no-deps 'leptonai==0.47.1' "
    "(in a prefect-swarm clone, as the README installs it)"
)
TRANSIENT_STATUSES = frozenset({429, 502, 503, 504})
LABEL_SWARM = "prefect-swarm-swarm"
LABEL_JOB = "prefect-swarm-job"
LABEL_CREATE = "prefect-swarm-create"
"""Label holding the name a job was created under: Lepton job names are not unique, so a retried
create finds the job an earlier try made by this label, and adopts it instead of making another."""

LABEL_OWNER = "prefect-swarm-owner"
"""Label holding the identity of the swarm (its home's :func:`swarm_owner`) that made a deployment or
job: ``up`` adopts, and ``down``, scale and the reaper touch, only what carries this swarm's."""
OWNER_ENV = jobenv.OWNER
"""The same identity as an env var of the endpoint's spec: the new Endpoint API has no labels
(leptonai 0.47.1 api/v2/translation.py ``_reject_unrepresentable_labels``), its spec's envs are read
back on both APIs."""

T = TypeVar("T")


def swarm_owner(paths: SwarmPaths) -> str:
    """This home's identity of the swarm: ``<user>-<host>-<random>`` (a label value), made once and
    kept in ``paths.owner_file``. Two homes (two laptops, a Prefect worker) with one swarm name have
    two identities, so neither takes over nor deletes what the other made."""
    import getpass
    import secrets
    import socket

    from prefect_swarm.paths import file_lock

    path = paths.owner_file
    with file_lock(path.with_name(path.name + ".lock")):
        try:
            found = path.read_text().strip()
        except FileNotFoundError:
            found = ""
        if found:
            return found
        who = re.sub(r"[^a-z0-9]+", "-", f"{getpass.getuser()}-{socket.gethostname().split('.')[0]}".lower())
        owner = f"{who.strip('-')[:40].strip('-') or 'swarm'}-{secrets.token_hex(4)}"
        path.write_text(owner + "\n")
        return owner


def owner_mark(obj: Any) -> str | None:
    """The swarm identity an SDK deployment/endpoint/job carries: its :data:`LABEL_OWNER` label,
    else (the new Endpoint API has no labels) the :data:`OWNER_ENV` env var of its spec; None
    when it carries neither (made by hand, by another tool, or by another prefect-swarm)."""
    labels = getattr(getattr(obj, "metadata", None), "labels", None) or {}
    if labels.get(LABEL_OWNER):
        return str(labels[LABEL_OWNER])
    for var in getattr(getattr(obj, "spec", None), "envs", None) or []:
        if getattr(var, "name", None) == OWNER_ENV and getattr(var, "value", None):
            return str(var.value)
    return None


def import_sdk() -> Any:
    """``leptonai.api.v2`` imported now; ConfigError with the install hint when it is missing."""
    try:
        import leptonai.api.v2 as v2
        import leptonai.api.v2.types.deployment  # the spec types below live here
        import leptonai.api.v2.types.job  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"the lepton backend needs the leptonai SDK, which is not installed ({exc}). "
            f"Install it with: {INSTALL_HINT}"
        ) from None
    return v2


# ---------------------------------------------------------------------------------- error mapping
def _status_of(exc: BaseException) -> int | None:
    """The HTTP status of a failed call: its response's, or (leptonai 0.47.1 ``LogAPIError``, which
    carries no response) its own ``status_code``."""
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    if not isinstance(code, int):
        code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def _api_message(exc: BaseException) -> str:
    """The API's own message from a ClientError/ServerError body (JSON ``message`` when present)."""
    response = getattr(exc, "response", None)
    text = str(getattr(response, "text", "") or "")
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or text).strip()[:500]
    return text.strip()[:500]


def _retry_after(exc: BaseException) -> float | None:
    given = getattr(exc, "retry_after", None)  # LogAPIError parses it itself
    if isinstance(given, int | float):
        return float(given)
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    try:
        return float(headers.get("Retry-After", ""))
    except (TypeError, ValueError):
        return None


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: 429/502/503/504 and lost connections."""
    import requests

    if isinstance(exc, requests.ConnectionError | requests.Timeout):
        return True
    return _status_of(exc) in TRANSIENT_STATUSES


def is_conflict(exc: BaseException) -> bool:
    """True when ``exc`` (or the SDK error it was mapped from) is HTTP 409: the name is taken."""
    return _status_of(exc) == 409 or (exc.__cause__ is not None and _status_of(exc.__cause__) == 409)


def is_not_found(exc: BaseException) -> bool:
    """True when the SDK reports HTTP 404 for the object asked about."""
    return _status_of(exc) == 404


def auth_error(workspace_id: str, url: str, status: int | None, token_env: str) -> ConfigError:
    """The message for a rejected token or an unknown workspace: what, where, what to check."""
    what = {401: "rejected the token", 403: "refused access", 404: "does not know the workspace"}.get(
        status or 0, "refused the request"
    )
    return ConfigError(
        f"Lepton {what} for workspace '{workspace_id}' (HTTP {status}, API {url}).\n"
        f"Hint: check backend.workspace_id, backend.workspace_url, and that backend.token (or ${token_env}) "
        "is a current token of that workspace (dashboard -> Settings -> Tokens)"
        + ("; tokens expire (one day by default), so an old one fails like a wrong one." if status == 401 else ".")
    )


def map_lepton_error(exc: BaseException, *, what: str, workspace_id: str, url: str, token_env: str) -> Exception:
    """Translate an SDK/transport failure of ``what`` into our exception tree (the cause is kept)."""
    import requests

    if isinstance(exc, PrefectSwarmError):
        return exc
    status = _status_of(exc)
    type_name = type(exc).__name__
    if type_name in ("WorkspaceUnauthorizedError", "WorkspaceForbiddenError", "WorkspaceNotFoundError"):
        # The SDK's own message embeds part of the token: never pass it on.
        status = {"WorkspaceUnauthorizedError": 401, "WorkspaceForbiddenError": 403}.get(type_name, 404)
        return auth_error(workspace_id, url, status, token_env)
    if status in (401, 403):
        return auth_error(workspace_id, url, status, token_env)
    if isinstance(exc, requests.ConnectionError | requests.Timeout):
        return BackendError(
            f"could not reach the Lepton API to {what} (workspace '{workspace_id}', {url}): {type_name}.",
            hint="check backend.workspace_url and the network; the call was retried before giving up.",
        )
    if status in TRANSIENT_STATUSES:
        return BackendError(
            f"the Lepton API stayed unavailable while trying to {what} (HTTP {status}, workspace '{workspace_id}').",
            stderr=_api_message(exc),
            hint="the call was retried with backoff; try again later or check the workspace status.",
        )
    if status is not None:
        return BackendError(
            f"the Lepton API refused to {what} (HTTP {status}, workspace '{workspace_id}'): {_api_message(exc)}",
            hint="the message above is the API's; fix the named field in the backend config."
            if status < 500
            else "a server-side error; retry later.",
        )
    if isinstance(exc, ValueError):  # the SDK's client-side validation (job names, env names, mounts)
        return ConfigError(f"the Lepton SDK refused to {what}: {exc}")
    return BackendError(f"the Lepton SDK failed to {what} (workspace '{workspace_id}'): {type_name}: {exc}")


# ---------------------------------------------------------------------------------- the client
class LeptonClient:
    """One workspace, reached through the leptonai SDK with retries and mapped errors."""

    attempts: int = 6
    """Tries of one call when it keeps failing transiently."""
    backoff_max_s: float = 10.0
    """Longest delay between tries (a larger Retry-After is capped too)."""

    def __init__(self, cfg: LeptonConfig, *, backoff_s: float | None = None) -> None:
        """``backoff_s``: the first delay between tries (doubling each try, capped by :attr:`backoff_max_s`);
        default: the setting ``PREFECT_SWARM_LEPTON_API_BACKOFF_S``."""
        self.cfg = cfg
        self.backoff_s = backoff_s if backoff_s is not None else get_settings().lepton_api_backoff_s
        self._api: Any = None
        self._resolved: LeptonConfig | None = None
        self.group_names: dict[str, str] = {}
        """Node group id -> name, as the last catalog read found them."""

    # ---------------------------------------------------------------- credentials
    def token(self) -> str:
        """The workspace token: ``backend.token``, else ``$<token_env>``; ConfigError when neither is set."""
        if self.cfg.token is not None and self.cfg.token.get_secret_value():
            return self.cfg.token.get_secret_value()
        value = os.environ.get(self.cfg.token_env, "")
        if not value:
            raise ConfigError(
                f"no Lepton token for workspace '{self.cfg.workspace_id}': set backend.token or the "
                f"environment variable {self.cfg.token_env}."
            )
        return value

    @property
    def api(self) -> Any:
        """The SDK's ``APIClient`` for this workspace (built on first use)."""
        if self._api is None:
            v2 = import_sdk()
            self._api = v2.APIClient(
                workspace_id=self.cfg.workspace_id, auth_token=self.token(), url=self.cfg.workspace_url
            )
        return self._api

    # ---------------------------------------------------------------- calls
    def call(self, what: str, fn: Callable[..., T], *args: Any, missing_ok: bool = False) -> T | None:
        """Run ``fn(api, *args)``: transient errors retried, others mapped; 404 is None if ``missing_ok``."""
        api = self.api

        @retry(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            before_sleep=lambda state: log.info(
                "Lepton API busy (%s) while trying to %s; retry %d/%d",
                _outcome_summary(state),
                what,
                state.attempt_number,
                self.attempts - 1,
            ),
            reraise=True,
        )
        def attempt() -> T:
            return fn(api, *args)

        try:
            return attempt()
        except Exception as exc:
            if missing_ok and is_not_found(exc):
                return None
            mapped = map_lepton_error(
                exc,
                what=what,
                workspace_id=self.cfg.workspace_id,
                url=str(api.url),
                token_env=self.cfg.token_env,
            )
            if mapped is exc:
                raise
            if type(exc).__name__.startswith("Workspace"):
                raise mapped from None  # its text holds part of the token
            raise mapped from exc

    def _wait(self, state: RetryCallState) -> float:
        delay = min(self.backoff_max_s, self.backoff_s * 2 ** (state.attempt_number - 1))
        exc = state.outcome.exception() if state.outcome else None
        after = _retry_after(exc) if exc else None
        return min(self.backoff_max_s, max(delay, after or 0.0))

    def check_access(self) -> None:
        """GET /workspace: fails fast, naming the workspace, when the token or workspace is wrong."""
        self.call("read the workspace", lambda api: api.info())

    # ---------------------------------------------------------------- secrets
    def secret_names(self) -> set[str]:
        """Names of the workspace's secrets (values are never listed)."""
        return {s.name for s in self.call("list secrets", lambda api: api.secret.list_all()) or []}

    def ensure_secret(self, name: str, value: str, *, replace: bool = False) -> None:
        """Create workspace secret ``name`` (the value goes only to the API). When it exists already
        it is kept, or with ``replace`` deleted and created again. Existence is read first, as the
        SDK's own ``lep secret create`` does (leptonai 0.47.1 cli/secret.py): nothing says the API
        refuses an existing name, so a create must not be relied on to. The API has no update:
        replace only where no other writer or starting pod can race (one caller per name)."""
        import_sdk()
        from leptonai.api.v2.types.secret import SecretItem

        item = SecretItem(name=name, value=value)
        if name in self.secret_names():
            if not replace:
                return
            self.call(f"delete old secret '{name}'", lambda api: api.secret.delete(name), missing_ok=True)
        try:
            self.call(f"create secret '{name}'", lambda api: api.secret.create([item]))
        except BackendError as exc:
            if not is_conflict(exc) or replace:
                raise  # a concurrent writer made it between the read and the create: theirs is kept

    def delete_secrets(self, prefix: str) -> None:
        """Delete every workspace secret whose name starts with ``prefix`` (idempotent)."""
        items = self.call("list secrets", lambda api: api.secret.list_all()) or []
        for item in items:
            if item.name.startswith(prefix):
                self.call(
                    f"delete secret '{item.name}'",
                    lambda api, n: api.secret.delete(n),
                    item.name,
                    missing_ok=True,
                )


def read_log(stream: Iterator[str]) -> str:
    """What a replica's log stream yields until it ends or goes quiet past its read timeout.

    leptonai 0.47.1's ``get_log`` (api/v2/job.py, endpoint.py) streams "until timeout is reached":
    a live replica's stream stays open, and the read timeout then surfaces from ``iter_content``
    as ``requests.ConnectionError`` wrapping urllib3's ``ReadTimeoutError``. That ends the read and
    keeps what came; any other failure is raised (a lost connection is retried by the caller)."""
    import requests
    from urllib3.exceptions import ReadTimeoutError

    chunks: list[str] = []
    try:
        for chunk in stream:
            chunks.append(chunk)
    except requests.ConnectionError as exc:
        if not (exc.args and isinstance(exc.args[0], ReadTimeoutError)):
            raise
    except requests.ReadTimeout:  # quiet before the first byte: nothing to keep
        pass
    return "".join(chunks)


def image_pull_secret_names(api: Any) -> list[str]:
    """Names of the workspace's image-pull secrets (``GET /imagepullsecrets``). leptonai 0.47.1 has
    no API object for this route, so it is read the SDK's documented way: an ``APIResourse``."""
    from leptonai.api.v2.api_resource import APIResourse

    class ImagePullSecretAPI(APIResourse):
        def list_names(self) -> list[str]:
            items = self.ensure_json(self._get("/imagepullsecrets")) or []
            return [str((it.get("metadata") or {}).get("name") or it.get("name") or "") for it in items]

    return ImagePullSecretAPI(api).list_names()


def node_group_catalog(api: Any) -> list[dict[str, Any]]:
    """The workspace's node groups as the API lists them (``GET /dedicated-node-groups``), raw.

    leptonai 0.47.1's ``nodegroup.list_all`` drops an entry its models refuse with only a
    "[lepton-error] Skipped ..." line on stderr (api/v2/api_resource.py ``ensure_list``), and reads
    a volume type it does not know as "UNK" (types/dedicated_node_group.py ``VolumeFrom``): a
    pre-flight on its answer would refuse a node group that exists, or accept a volume of another
    type. The raw list keeps both; :func:`check_catalogs` warns about an entry the SDK cannot read."""
    from leptonai.api.v2.api_resource import APIResourse

    class NodeGroupCatalog(APIResourse):
        def raw(self) -> list[dict[str, Any]]:
            items = self.ensure_json(self._get("/dedicated-node-groups")) or []
            return [it for it in items if isinstance(it, dict)]

    return NodeGroupCatalog(api).raw()


def _group_id(group: Mapping[str, Any]) -> str:
    return str((group.get("metadata") or {}).get("id") or "")


def _group_volumes(group: Mapping[str, Any]) -> set[str]:
    """``node-<type>:<name>`` of each volume a node group lists (each group has its own list)."""
    vols = (group.get("spec") or {}).get("volumes") or []
    return {f"node-{v.get('from')}:{v.get('name')}" for v in vols if isinstance(v, dict) and v.get("name")}


def _warn_unreadable(groups: list[dict[str, Any]], where: str) -> None:
    from leptonai.api.v2.types.dedicated_node_group import DedicatedNodeGroup

    for group in groups:
        try:
            DedicatedNodeGroup.model_validate(group)
        except ValueError as exc:
            log.warning(
                "node group '%s' of %s: the leptonai SDK cannot read its catalog entry (%s) and leaves it out "
                "of nodegroup.list_all(); checked from the API's own entry",
                _group_id(group),
                where,
                str(exc).splitlines()[0],
            )


def group_names(groups: list[dict[str, Any]]) -> dict[str, str]:
    """Node group id -> its name (its id when it has none)."""
    return {_group_id(g): str((g.get("metadata") or {}).get("name") or _group_id(g)) for g in groups}


def _resolve_node_groups(b: LeptonConfig, groups: list[dict[str, Any]], where: str) -> list[str]:
    """The id of each ``backend.node_groups`` entry, given by id or by name: an id first, then a
    name (the SDK's CLI takes names, cli/util.py ``_get_valid_nodegroup_ids``, and matches either,
    ``resolve_node_groups``); the API's affinity takes ids. ConfigError naming what the workspace has."""
    ids = group_names(groups)
    listed = ", ".join(f"{name} (id {gid})" for gid, name in sorted(ids.items())) or "none"
    out: list[str] = []
    for ng in b.node_groups:
        by_name = [gid for gid, name in ids.items() if name == ng]
        if ng in ids:
            out.append(ng)
        elif len(by_name) == 1:
            out.append(by_name[0])
        elif by_name:
            raise ConfigError(
                f"backend.node_groups: {where} has {len(by_name)} node groups named '{ng}' "
                f"(ids {', '.join(sorted(by_name))}): give the id."
            )
        else:
            raise ConfigError(
                f"backend.node_groups: {where} has no node group '{ng}' (by id or name); it has: {listed}."
            )
    return list(dict.fromkeys(out))


def _check_mounts(b: LeptonConfig, groups: list[dict[str, Any]], where: str) -> None:
    """Each mount's volume must be on a node group the workloads may use; with ``backend.node_groups``
    on every one of them (a replica placed on a group without it could not mount it)."""
    usable = [g for g in groups if not b.node_groups or _group_id(g) in b.node_groups]
    have = {_group_id(g): _group_volumes(g) for g in usable}
    volumes = {"node-local"}.union(*have.values())
    for i, m in enumerate(b.mounts):
        if m.from_ == "node-local":
            continue
        lacking = sorted(gid for gid, vols in have.items() if m.from_ not in vols)
        if m.from_ in volumes and not (b.node_groups and lacking):
            continue
        scope = (
            f"node group '{lacking[0]}'"
            if m.from_ in volumes
            else ("backend.node_groups" if b.node_groups else "its node groups")
        )
        raise ConfigError(
            f"backend.mounts[{i}].from: {where} has no volume '{m.from_}' on {scope}; "
            f"it has: {', '.join(sorted(volumes))}."
            + (" Each node group has its own volumes: pin node groups that all have it." if b.node_groups else "")
        )


def resolved(client: LeptonClient) -> LeptonConfig:
    """``client.cfg`` with ``node_groups`` as ids (names resolved through the workspace's catalog;
    read once per client). As given when the config pins none, or the workspace has no catalog route."""
    b = client.cfg
    if not b.node_groups:
        return b
    if client._resolved is None:
        groups = client.call("list node groups", node_group_catalog, missing_ok=True)
        client.group_names = group_names(groups or [])
        ids = b.node_groups if groups is None else _resolve_node_groups(b, groups, f"workspace '{b.workspace_id}'")
        client._resolved = b.model_copy(update={"node_groups": ids})
    return client._resolved


def check_catalogs(client: LeptonClient) -> LeptonConfig:
    """Refuse ``backend.node_groups``, mount volumes and ``image_pull_secrets`` the workspace does
    not have, naming the field and what the workspace has, before anything is created. A catalog
    whose route the workspace does not serve (404) is left to the create call. Returns the backend
    config with node groups as ids (:func:`resolved`)."""
    b = client.cfg
    where = f"workspace '{b.workspace_id}'"
    groups = client.call("list node groups", node_group_catalog, missing_ok=True)
    if groups is not None:
        _warn_unreadable(groups, where)
        client.group_names = group_names(groups)
        client._resolved = b = b.model_copy(update={"node_groups": _resolve_node_groups(b, groups, where)})
        _check_mounts(b, groups, where)
    if b.image_pull_secrets:
        names = client.call("list image pull secrets", image_pull_secret_names, missing_ok=True)
        if names is not None:
            for secret in b.image_pull_secrets:
                if secret not in names:
                    raise ConfigError(
                        f"backend.image_pull_secrets: {where} has no image pull secret '{secret}'; it has: "
                        f"{', '.join(sorted(names)) or 'none'}. Create it in the dashboard (Settings -> "
                        "Registries) or fix the name."
                    )
    return b


def _outcome_summary(state: RetryCallState) -> str:
    exc = state.outcome.exception() if state.outcome else None
    status = _status_of(exc) if exc else None
    return f"HTTP {status}" if status else type(exc).__name__


# ---------------------------------------------------------------------------------- spec helpers
def env_vars(values: Mapping[str, str], secret_refs: Mapping[str, str] | None = None) -> list[Any]:
    """SDK ``EnvVar`` list: plain values, then ``{name: secret}`` as secret references."""
    from leptonai.api.v2.types.deployment import EnvValue, EnvVar

    out = [EnvVar(name=k, value=v) for k, v in values.items()]
    out += [EnvVar(name=k, value_from=EnvValue(secret_name_ref=s)) for k, s in (secret_refs or {}).items()]
    return out


def mounts(cfg: LeptonConfig) -> list[Any]:
    """SDK ``Mount`` list from ``backend.mounts``."""
    from leptonai.api.v2.types.deployment import Mount

    return [Mount(path=m.path, mount_path=m.mount_path, **{"from": m.from_}) for m in cfg.mounts]


def affinity(cfg: LeptonConfig) -> Any:
    """SDK affinity restricting scheduling to ``backend.node_groups`` (None when unset)."""
    from leptonai.api.v2.types.affinity import LeptonResourceAffinity

    return LeptonResourceAffinity(allowed_dedicated_node_groups=list(cfg.node_groups)) if cfg.node_groups else None


OWNED_DEPLOYMENT_FIELDS = frozenset(
    {
        "container",
        "envs",
        "mounts",
        "api_tokens",
        "allow_unauthenticated_access",
        "image_pull_secrets",
        "reservation_config",
        "resource_requirement.resource_shape",
        "resource_requirement.min_replicas",
        "resource_requirement.affinity",
    }
)
"""Fields of the endpoint spec prefect-swarm sets from its own config (``backend.deployment_spec``
may not)."""
OWNED_JOB_FIELDS = frozenset(
    {
        "container",
        "envs",
        "mounts",
        "image_pull_secrets",
        "resource_shape",
        "affinity",
        "completions",
        "parallelism",
        "stopped",
        "queue_config",
        "reservation_config",
    }
)
"""Fields of a job spec prefect-swarm sets from its own config (``backend.job_spec`` may not)."""


def _deep_merge(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(ours)
    for key, value in theirs.items():
        mine = out.get(key)
        out[key] = _deep_merge(mine, value) if isinstance(mine, Mapping) and isinstance(value, Mapping) else value
    return out


def with_passthrough(spec: Any, extra: Mapping[str, Any], field: str, owned: frozenset[str]) -> Any:
    """``spec`` (an SDK user-spec model) with ``backend.<field>`` merged in, validated by the SDK's
    own model; ConfigError naming the key for a field prefect-swarm owns, one the SDK does not
    know, or a value it refuses."""
    model = type(spec)
    known = {name for name, f in model.model_fields.items()} | {f.alias for f in model.model_fields.values() if f.alias}
    for key, value in extra.items():
        subkeys = [f"{key}.{sub}" for sub in value] if isinstance(value, Mapping) else []
        taken = [k for k in (key, *subkeys) if k in owned]
        if taken:
            raise ConfigError(
                f"backend.{field}.{taken[0]}: prefect-swarm sets this field itself from the backend config "
                "(resource shapes, node_groups, reservation, job_priority, mounts, secret_env...); remove it."
            )
        if key not in known:
            raise ConfigError(
                f"backend.{field}.{key}: not a field of the Lepton SDK's {model.__name__}; "
                f"it has: {', '.join(sorted(known))}."
            )
    if not extra:
        return spec
    try:
        return model.model_validate(_deep_merge(spec.model_dump(by_alias=True, exclude_none=True), extra))
    except ValueError as exc:
        raise ConfigError(f"backend.{field}: the Lepton SDK refuses it: {exc}") from None


def queue_config(cfg: LeptonConfig) -> Any:
    """SDK ``QueueConfig`` of a batch job from ``job_priority`` / ``job_preemptible`` (None when
    neither is set); the priority defaults to mid-4000 when only preemption is set, as the SDK's
    CLI does (cli/util.py ``apply_nodegroup_and_queue_config``)."""
    from leptonai.api.v2.types.deployment import QueueConfig

    if cfg.job_priority is None and cfg.job_preemptible is None:
        return None
    return QueueConfig(priority_class=cfg.job_priority or "mid-4000", can_be_preempted=cfg.job_preemptible)


def reservation_config(cfg: LeptonConfig) -> Any:
    """SDK ``ReservationConfig`` for ``backend.reservation`` (None when unset)."""
    from leptonai.api.v2.types.deployment import ReservationConfig

    return ReservationConfig(reservation_id=cfg.reservation) if cfg.reservation else None


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n].upper()


def _key_part(key: str) -> str:
    """An env name as it stands when it is already a plain upper-case name; else made one, plus a
    digest of the real name, so two names never share a secret."""
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
        return key
    return re.sub(r"[^A-Z0-9_]", "_", key.upper()) + "_" + _digest(key, 6)


def secret_prefix(swarm: str, owner: str) -> str:
    """Prefix of every workspace secret prefect-swarm creates for ``swarm`` made by ``owner`` (its
    :func:`swarm_owner`): a fixed-length digest of both, so no swarm's prefix is a prefix of
    another's, and a swarm of the same name from another home never reads nor deletes these (a
    secret has no labels: its name is its mark)."""
    return f"PSW_{_digest(swarm + chr(0) + owner, 12)}_"


def swarm_secret_name(swarm: str, owner: str, key: str) -> str:
    """The secret holding env var ``key`` shared by all of ``swarm``'s jobs (its API key)."""
    return f"{secret_prefix(swarm, owner)}S_{_key_part(key)}"


def job_secret_name(swarm: str, owner: str, job: str, key: str) -> str:
    """The secret holding env var ``key`` of job submission ``job`` of ``swarm``."""
    return f"{secret_prefix(swarm, owner)}J{_digest(job, 8)}_{_key_part(key)}"


def under_mount(cfg: LeptonConfig, path: str) -> bool:
    """True when ``path`` lies at or below one of the config's mount paths."""
    norm = os.path.normpath(path)
    for m in cfg.mounts:
        root = os.path.normpath(m.mount_path)
        if norm == root or norm.startswith(root.rstrip("/") + "/"):
            return True
    return False


def validate_lepton(cfg: LeptonConfig) -> None:
    """Refuse a Lepton config that cannot work, before any call to the workspace."""
    where = f"workspace '{cfg.workspace_id}'"
    if not cfg.mounts or not cfg.shared_path:
        raise ConfigError(
            "backend.shared_path: the lepton backend keeps ledgers and output on shared storage, so it needs "
            f"backend.mounts and a backend.shared_path under one of their mount_path values ({where}). "
            "Add e.g. mounts: [{path: /prefect-swarm, mount_path: /mnt/shared}] and "
            "shared_path: /mnt/shared/runs."
        )
    if not under_mount(cfg, cfg.shared_path):
        paths = ", ".join(m.mount_path for m in cfg.mounts)
        raise ConfigError(
            f"backend.shared_path '{cfg.shared_path}' is not under any mount_path ({paths}); "
            "jobs could not share their ledgers. Put shared_path under one of them."
        )
    for m in cfg.mounts:
        if not m.mount_path.startswith("/"):
            raise ConfigError(f"backend.mounts: mount_path '{m.mount_path}' must be an absolute path.")
