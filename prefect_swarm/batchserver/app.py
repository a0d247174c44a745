"""The batch service's HTTP API: OpenAI's Files and Batches endpoints, as the ``openai`` SDK calls them.

    POST   /v1/files                     upload (multipart: purpose=batch, file)
    GET    /v1/files                     list (purpose, after, limit, order)
    GET    /v1/files/{id}                retrieve
    GET    /v1/files/{id}/content        the bytes
    DELETE /v1/files/{id}                delete
    POST   /v1/batches                   create (input_file_id, endpoint, completion_window, metadata)
    GET    /v1/batches                   list (after, limit), newest first
    GET    /v1/batches/{id}              retrieve
    POST   /v1/batches/{id}/cancel       cancel

Every route needs a tenant's key (``Authorization: Bearer ...``) and sees that tenant's objects
only: another tenant's id is answered as one that does not exist. Errors have OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``). An upload is streamed to disk and refused as
soon as it passes the size or line limit (what was written is removed). The access log has the
method, path and status of each request: never a header (so never a key) or a body (never a prompt).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

from aiohttp import BodyPartReader, web

from prefect_swarm.batchserver.config import LoadedService
from prefect_swarm.batchserver.runner import BatchRunner
from prefect_swarm.batchserver.store import ACTIVE, FileRow, ServiceStore, new_id
from prefect_swarm.batchserver.validate import check_input, endpoint_problem
from prefect_swarm.paths import temp_name

STORE = web.AppKey("store", ServiceStore)
SERVICE = web.AppKey("service", LoadedService)
RUNNER = web.AppKey("runner", BatchRunner)

CHUNK = 1 << 20
WINDOW = re.compile(r"^(\d+)([smh])$")
WINDOW_S = {"s": 1, "m": 60, "h": 3600}
MAX_WINDOW_S = 7 * 24 * 3600
ACCESS_LOG_FORMAT = '%a "%r" %s %b %Tfs'
"""The request line (method, path with ids, no body), status, size and time: never a header."""


class ApiError(web.HTTPException):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        self.status_code = status
        body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
        super().__init__(text=json.dumps(body), content_type="application/json")


def _not_found(kind: str, oid: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"No such {kind}: '{oid[:64]}'.", param=param, code=None)


# ---------------------------------------------------------------------------------------- auth
@web.middleware
async def authenticate(request: web.Request, handler: Any) -> web.StreamResponse:
    """Find the tenant of the request's key; refuse (401) without one."""
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    tenant = request.app[STORE].tenant_of(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
    if tenant is None:
        raise ApiError(
            401,
            "Incorrect or missing API key. Send a key of this batch service (`prefect-swarm serve keys create "
            "TENANT` makes one) as 'Authorization: Bearer KEY'.",
            code="invalid_api_key",
        )
    request["tenant"] = tenant
    return await handler(request)


def _tenant(request: web.Request) -> str:
    return str(request["tenant"])


# ---------------------------------------------------------------------------------------- files
async def upload_file(request: web.Request) -> web.Response:
    """Stream an upload to disk within the limits, then record it."""
    store, cfg = request.app[STORE], request.app[SERVICE].cfg
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError) as exc:  # aiohttp refuses a non-multipart body so
        raise ApiError(400, "Upload the file as multipart/form-data with fields 'purpose' and 'file'.") from exc
    purpose, stored, fid = None, None, new_id("file-")
    tmp = store.paths.files / temp_name(f"{fid}.jsonl", "upload")
    try:
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "purpose":
                purpose = (await part.text()).strip()
            elif part.name == "file":
                stored = (_filename(part.filename), *await _stream(part, tmp, cfg.max_file_bytes, cfg.max_requests))
        if purpose != "batch":
            raise ApiError(
                400,
                f"Invalid value for 'purpose': {purpose!r}. This service stores batch input files: purpose=batch.",
                param="purpose",
            )
        if stored is None:
            raise ApiError(400, "The upload has no 'file' field.", param="file")
        filename, size, lines = stored
        tmp.rename(store.paths.file(fid))
    finally:
        tmp.unlink(missing_ok=True)
    row = store.add_file(FileRow(fid, _tenant(request), filename, "batch", size, lines, int(time.time())))
    return web.json_response(row.object())


def _filename(name: str | None) -> str:
    """The name a client gave, kept as a label only (never a path here)."""
    base = (name or "upload.jsonl").replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(c for c in base if c.isprintable())[:255] or "upload.jsonl"


async def _stream(part: BodyPartReader, tmp: Path, max_bytes: int, max_lines: int) -> tuple[int, int]:
    size = lines = 0
    last = b"\n"
    with tmp.open("wb") as fh:
        while chunk := await part.read_chunk(CHUNK):
            size += len(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
            if size > max_bytes:
                raise ApiError(
                    413,
                    f"The file is larger than {max_bytes} bytes, the most this service accepts. Split it into "
                    "several batches.",
                    param="file",
                    code="file_too_large",
                )
            if lines > max_lines:
                raise ApiError(
                    400,
                    f"The file has more than {max_lines} lines, the most requests of one batch here. Split it "
                    "into several batches.",
                    param="file",
                    code="too_many_requests",
                )
            fh.write(chunk)
    return size, lines + (last != b"\n")


def _page(request: web.Request, default: int, most: int) -> tuple[str | None, int]:
    after = request.query.get("after") or None
    raw = request.query.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ApiError(400, f"Invalid value for 'limit': {raw[:20]!r}; give 1 to {most}.", param="limit")
    return after, int(raw)


def _list(data: list[dict[str, Any]], has_more: bool) -> web.Response:
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


async def list_files(request: web.Request) -> web.Response:
    """A page of the tenant's files."""
    after, limit = _page(request, 10_000, 10_000)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "Invalid value for 'order': give 'asc' or 'desc'.", param="order")
    rows, more = request.app[STORE].list_files(
        _tenant(request), purpose=request.query.get("purpose"), after=after, limit=limit, order=order
    )
    return _list([r.object() for r in rows], more)


def _file(request: web.Request) -> FileRow:
    fid = request.match_info["file_id"]
    row = request.app[STORE].get_file(_tenant(request), fid)
    if row is None:
        raise _not_found("file", fid, "file_id")
    return row


async def get_file(request: web.Request) -> web.Response:
    """One of the tenant's files."""
    return web.json_response(_file(request).object())


async def file_content(request: web.Request) -> web.StreamResponse:
    """The bytes of one of the tenant's files."""
    row = _file(request)
    return web.FileResponse(request.app[STORE].paths.file(row.id), headers={"Content-Type": "application/jsonl"})


async def delete_file(request: web.Request) -> web.Response:
    """Delete one of the tenant's files; the input of a batch still running is refused (409)."""
    store, row = request.app[STORE], _file(request)
    if any(b.tenant == row.tenant and b.doc.get("input_file_id") == row.id for b in store.active_batches()):
        raise ApiError(
            409, f"File '{row.id}' is the input of a batch still running; cancel the batch first.", param="file_id"
        )
    store.delete_file(row.tenant, row.id)
    return web.json_response({"id": row.id, "object": "file", "deleted": True})


# ---------------------------------------------------------------------------------------- batches
async def create_batch(request: web.Request) -> web.Response:
    """Check the input file as OpenAI does (in a thread: it reads every line) and record the batch:
    ``failed`` with its ``errors`` (nothing is sent), or ``validating`` until the runner starts it."""
    store, svc = request.app[STORE], request.app[SERVICE]
    args = await _json(request)
    endpoint, window = args.get("endpoint"), args.get("completion_window", "24h")
    problem = endpoint_problem(endpoint)
    if problem:
        raise ApiError(400, problem, param="endpoint")
    window_s = _window(window)
    metadata = _metadata(args.get("metadata"))
    fid = str(args.get("input_file_id") or "")
    src = store.get_file(_tenant(request), fid)
    if src is None:
        raise _not_found("file", fid or "(none)", "input_file_id")
    if src.purpose != "batch":
        raise ApiError(
            400,
            f"File '{fid}' has purpose '{src.purpose}'; a batch's input needs purpose 'batch'.",
            param="input_file_id",
        )
    checked = await asyncio.to_thread(
        check_input, store.paths.file(fid), str(endpoint), set(svc.swarms), svc.cfg.max_requests
    )
    now = int(time.time())
    doc: dict[str, Any] = {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": endpoint,
        "model": checked.model,
        "errors": None,
        "input_file_id": fid,
        "completion_window": window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + window_s,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": checked.total, "completed": 0, "failed": 0},
        "metadata": metadata,
        "usage": None,
    }
    if checked.errors:
        doc.update(status="failed", failed_at=now, errors={"object": "list", "data": checked.errors})
    row = store.add_batch(_tenant(request), doc, checked.model)
    request.app[RUNNER].wake.set()
    return web.json_response(row.doc)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise ApiError(400, "The request body is not JSON.") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


def _window(window: object) -> int:
    match = WINDOW.match(window) if isinstance(window, str) else None
    seconds = int(match.group(1)) * WINDOW_S[match.group(2)] if match else 0
    if not 1 <= seconds <= MAX_WINDOW_S:
        raise ApiError(
            400,
            f"Invalid value for 'completion_window': {str(window)[:20]!r}. Give '24h' (OpenAI's), or a duration "
            "such as '30m' or '2h' up to 168h.",
            param="completion_window",
        )
    return seconds


def _metadata(meta: object) -> dict[str, str] | None:
    if meta is None:
        return None
    pairs = list(meta.items()) if isinstance(meta, dict) else []
    fits = all(isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in pairs)
    if not isinstance(meta, dict) or len(pairs) > 16 or not fits:
        raise ApiError(
            400,
            "Invalid 'metadata': at most 16 string pairs, keys up to 64 and values up to 512 characters.",
            param="metadata",
        )
    return {str(k): str(v) for k, v in pairs}


def _batch_doc(request: web.Request) -> dict[str, Any]:
    bid = request.match_info["batch_id"]
    row = request.app[STORE].get_batch(_tenant(request), bid)
    if row is None:
        raise _not_found("batch", bid, "batch_id")
    return row.doc


async def get_batch(request: web.Request) -> web.Response:
    """One of the tenant's batches."""
    return web.json_response(_batch_doc(request))


async def list_batches(request: web.Request) -> web.Response:
    """A page of the tenant's batches, newest first."""
    after, limit = _page(request, 20, 100)
    rows, more = request.app[STORE].list_batches(_tenant(request), after=after, limit=limit)
    return _list([r.doc for r in rows], more)


async def cancel_batch(request: web.Request) -> web.Response:
    """Ask the runner to stop a batch: ``cancelling`` now, ``cancelled`` once what was answered is in
    its files. A batch already ending or ended is refused (409), as OpenAI does."""
    store, doc = request.app[STORE], _batch_doc(request)
    if doc["status"] == "cancelling":
        return web.json_response(doc)
    if doc["status"] not in ACTIVE or doc["status"] == "finalizing":
        raise ApiError(409, f"Cannot cancel a batch with status '{doc['status']}'.", param="batch_id")
    row = store.update_batch(doc["id"], {"status": "cancelling", "cancelling_at": int(time.time())}, cancel_requested=1)
    request.app[RUNNER].wake.set()
    return web.json_response(row.doc)


# ---------------------------------------------------------------------------------------- the app
def make_app(store: ServiceStore, svc: LoadedService, runner: BatchRunner) -> web.Application:
    """The aiohttp application (the runner is started and stopped with it)."""
    app = web.Application(middlewares=[authenticate])
    app[STORE], app[SERVICE], app[RUNNER] = store, svc, runner
    app.router.add_post("/v1/files", upload_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", get_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)

    async def lifecycle(app: web.Application) -> Any:
        runner.start()
        yield
        with contextlib.suppress(Exception):
            await asyncio.to_thread(runner.stop)

    app.cleanup_ctx.append(lifecycle)
    return app
