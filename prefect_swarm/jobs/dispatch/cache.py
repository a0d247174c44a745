"""Identical requests sent once: deduplication within a shard, and the response cache across jobs.

A request is identified by its key: a 128-bit BLAKE2b of the swarm's engine fingerprint, the route
and the JSON body with its keys sorted (:func:`canonical`: the request the engine gets, ``model``
included). Two rows whose keys are equal ask the engine the same thing.

**Within a job** (:class:`Dedup`, on unless the job's ``cache`` is false): each shard sends one
request per key; rows that ask the same while it is in flight wait for its answer (their row
number and id only), and rows asking it later are answered from the shard's memory of its last
:data:`RECENT_ANSWERS` distinct answers. Every row still gets its own ledger row, written once:
a row answered by another's request is written when that answer arrives, never before, so a
stopped or killed shard leaves it pending like any unanswered row (a resume sends it, or finds it
in the cache). The memory is bounded: an identical request further back than that window, or in
another shard, is deduplicated through the response cache only (when on).

**Across jobs** (:class:`ResponseCache`, opt-in): the 200 answers a job's requests got are kept in
one SQLite database (``responses.db`` in the cache folder, WAL on a local filesystem, a rollback
journal on a network one, like the state database), keyed as above. A later request with the same
key on a swarm with the same engine fingerprint is answered from it without being sent. Several
job processes (two jobs at once, every shard of one) read and write it together, in short
transactions under SQLite's busy timeout; a key holds the latest answer a request got (a stored
answer the job refuses to parse is asked again and replaced). Its live size is held under
``max_bytes``: past it, the answers used least recently are dropped. The cache is a cache: the
ledger stays the one truth of what a row got, and an error of the cache (a damaged file, a full
disk) turns it off for the rest of the run with a warning; it never fails a row.

What a reused answer means: for a greedy request (temperature 0) or one with a ``seed``, the
answer the engine gives to that request. For an unseeded request that samples (temperature > 0,
or no temperature: most engines default to 1), one draw reused: every row asking exactly that gets
the same draw, in this job and in later ones with the cache on. For independent draws give each
row its own ``seed`` (a ``sampling_column``) or set the job's ``cache`` to false.

A reused row has ``attempts`` 0 and token counts 0: the tokens are counted once, on the row whose
request was sent, so the job's token totals, its cost and a token budget count what was spent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import sqlite3
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm.jobs.api import SwarmJob
from prefect_swarm.jobs.checkpoint.ledger import STATUS_OK, RowResult
from prefect_swarm.jobs.dispatch import fastjson
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import cache_db, journal_for, private_dir

if TYPE_CHECKING:
    from prefect_swarm.jobs.dispatch.runner import Item  # (the runner's aiohttp is the job process's, not the CLI's)
    from prefect_swarm.settings import Settings

log = logging.getLogger("prefect_swarm.jobs")

RECENT_ANSWERS = 8192
"""Distinct answers a shard keeps in memory for rows asking the same again (its dedup window)."""
PUT_EVERY = 2048
"""Answers a shard collects before it writes them to the cache (also written at each checkpoint)."""
LOOKUP_CHUNK = 500
"""Keys per lookup query (under SQLite's limit of bound parameters)."""
SCHEMA_VERSION = 1

try:
    import orjson

    def canonical(body: Mapping[str, Any]) -> bytes:
        """``body`` as compact JSON with its keys sorted at every level (the stdlib's for what orjson refuses)."""
        try:
            return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return _std_canonical(body)

except ImportError:  # pragma: no cover - orjson ships with prefect

    def canonical(body: Mapping[str, Any]) -> bytes:
        """``body`` as compact JSON with its keys sorted at every level."""
        return _std_canonical(body)


def _std_canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def request_key(fingerprint: str, path: str, body: Mapping[str, Any]) -> bytes:
    """The key of a request: the engine fingerprint, the route and the canonical body (16 bytes)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(fingerprint.encode())
    h.update(b"\n")
    h.update(path.encode())
    h.update(b"\n")
    h.update(canonical(body))
    return h.digest()


def reused(template: RowResult, row: int, rid: str) -> RowResult:
    """Row ``row``'s result from another row's (``template``): its outputs, status and error, no request."""
    return dataclasses.replace(
        template, row=row, rid=rid, prompt_tokens=0, completion_tokens=0, latency_ms=0.0, attempts=0
    )


class Dedup:
    """One shard's identical requests: the keys in flight (with the rows waiting for them) and the last
    :data:`RECENT_ANSWERS` answers. Memory: a key and a row number per row waiting, one answer per key kept."""

    def __init__(self, recent: int = RECENT_ANSWERS) -> None:
        self.waiting: dict[bytes, list[tuple[int, str]]] = {}
        """Key in flight -> (row, id) of the rows that asked the same since."""
        self.leaders: dict[int, bytes] = {}
        """Row whose request is in flight -> its key."""
        self.recent: OrderedDict[bytes, RowResult] = OrderedDict()
        self.size = recent

    def answer(self, key: bytes) -> RowResult | None:
        """The answer kept for ``key`` (marked recently used), if any."""
        found = self.recent.get(key)
        if found is not None:
            self.recent.move_to_end(key)
        return found

    def remember(self, key: bytes, result: RowResult) -> None:
        self.recent[key] = result
        self.recent.move_to_end(key)
        if len(self.recent) > self.size:
            self.recent.popitem(last=False)


def _connect(path: Path) -> tuple[sqlite3.Connection, Settings]:
    """A connection to the cache database at ``path`` that waits for a busy one as the settings say
    (imported here: pydantic-settings is for a job with the cache on, not every job process)."""
    from prefect_swarm.settings import get_settings

    settings = get_settings()
    return sqlite3.connect(path, timeout=settings.busy_timeout_ms / 1000, isolation_level=None), settings


class ResponseCache:
    """The response cache in ``folder`` for one engine ``fingerprint`` (see the module's docstring)."""

    def __init__(self, folder: Path, fingerprint: str, max_bytes: int | None = None) -> None:
        self.path, self.fingerprint, self.max_bytes = cache_db(folder), fingerprint, max_bytes
        private_dir(folder)
        self.db, settings = _connect(self.path)
        self.db.execute(f"PRAGMA busy_timeout={int(settings.busy_timeout_ms)}")
        self._setup(journal_for(folder, settings.state_journal), settings.busy_timeout_ms / 1000)
        self.puts: list[tuple[bytes, bytes]] = []
        self.used: list[bytes] = []

    def _setup(self, journal: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:  # a journal switch takes an exclusive lock, which SQLite may not wait for: retry
            try:
                if str(self.db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != journal:
                    self.db.execute(f"PRAGMA journal_mode={journal.upper()}")
                self.db.execute("PRAGMA synchronous=NORMAL")
                if int(self.db.execute("PRAGMA user_version").fetchone()[0]) != SCHEMA_VERSION:
                    with self._write():
                        self.db.execute(
                            "CREATE TABLE IF NOT EXISTS responses (key BLOB PRIMARY KEY, fingerprint TEXT NOT NULL, "
                            "body BLOB NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL, used REAL NOT NULL, "
                            "hits INTEGER NOT NULL DEFAULT 0)"
                        )
                        self.db.execute("CREATE INDEX IF NOT EXISTS responses_used ON responses(used)")
                        self.db.execute("CREATE INDEX IF NOT EXISTS responses_fp ON responses(fingerprint)")
                        self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _write(self) -> _Tx:
        return _Tx(self.db)

    # ------------------------------------------------------------------ read
    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        """The answers (response bodies) stored for ``keys``; each found one is marked used."""
        found: dict[bytes, bytes] = {}
        todo = list(dict.fromkeys(keys))
        for i in range(0, len(todo), LOOKUP_CHUNK):
            chunk = todo[i : i + LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            for key, body in self.db.execute(f"SELECT key, body FROM responses WHERE key IN ({marks})", chunk):
                found[bytes(key)] = zlib.decompress(body)
        self.used.extend(found)
        return found

    # ------------------------------------------------------------------ write
    def put(self, key: bytes, body: bytes) -> None:
        """Keep ``body`` as the answer to ``key`` (written by :meth:`flush`, or once :data:`PUT_EVERY` wait)."""
        self.puts.append((key, body))
        if len(self.puts) >= PUT_EVERY:
            self.flush()

    def flush(self) -> None:
        """Write the answers collected and mark the ones used, in one short transaction; then hold the bound."""
        if not self.puts and not self.used:
            return
        now = time.time()
        puts, used, self.puts, self.used = self.puts, self.used, [], []
        rows = [(k, self.fingerprint, zlib.compress(b, 1), now) for k, b in puts]
        with self._write():
            self.db.executemany(
                "INSERT OR REPLACE INTO responses (key, fingerprint, body, size, created, used) "
                "VALUES (?1, ?2, ?3, length(?3), ?4, ?4)",
                rows,
            )
            touch = [(now, k) for k in used]
            self.db.executemany("UPDATE responses SET used = ?, hits = hits + 1 WHERE key = ?", touch)
        if self.max_bytes is not None:
            prune(self.db, self.max_bytes)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.db.close()


class _Tx:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: object, *_: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def live_bytes(db: sqlite3.Connection) -> int:
    """Bytes of the database's pages in use (its file, less the free pages a deletion left)."""
    pages = int(db.execute("PRAGMA page_count").fetchone()[0]) - int(db.execute("PRAGMA freelist_count").fetchone()[0])
    return pages * int(db.execute("PRAGMA page_size").fetchone()[0])


def prune(db: sqlite3.Connection, max_bytes: int) -> int:
    """Past ``max_bytes`` of live pages, drop the answers used least recently (the least hit first among
    those used together) until 90 % of it is left;
    return how many were dropped."""
    dropped = 0
    while live_bytes(db) > max_bytes:
        count = int(db.execute("SELECT count(*) FROM responses").fetchone()[0])
        if not count:
            break
        excess = 1 - 0.9 * max_bytes / live_bytes(db)
        chunk = max(1, min(count, int(count * excess) + 1))
        with _Tx(db):
            db.execute(
                "DELETE FROM responses WHERE rowid IN (SELECT rowid FROM responses ORDER BY used, hits LIMIT ?)",
                (chunk,),
            )
        dropped += chunk
    return dropped


# ---------------------------------------------------------------------------------------- a shard
class Reuse:
    """What one shard reuses: identical rows' answers (:class:`Dedup`) and the cache (when the spec has one)."""

    def __init__(self, spec: JobSpec, job: SwarmJob, keep_raw: bool) -> None:
        self.fingerprint = spec.swarm_fingerprint or ""
        self.keep_raw = keep_raw
        self.dedup = Dedup()
        self.parse = job.parser()
        self.usage = job.usage
        self.hits = self.deduplicated = 0
        self.cache: ResponseCache | None = None
        if spec.cache_dir and not spec.swarm_fingerprint:
            log.warning("the response cache is off: the job has no engine fingerprint (a job on a swarm has one)")
        elif spec.cache_dir:
            folder, bound = Path(spec.cache_dir), spec.cache_max_bytes
            self.cache = self._guard(lambda: ResponseCache(folder, self.fingerprint, bound))

    @classmethod
    def of(cls, spec: JobSpec, job: SwarmJob, keep_raw: bool) -> Reuse | None:
        """The shard's reuse of answers; None when the job's ``cache`` is false (every row sends its own)."""
        return None if spec.cache is False else cls(spec, job, keep_raw)

    @property
    def wants_raw(self) -> bool:
        """The runner must keep each answer's body (to store it in the cache)."""
        return self.cache is not None

    def key(self, path: str, body: Mapping[str, Any]) -> bytes:
        return request_key(self.fingerprint, path, body)

    def resolve(self, items: list[tuple[Item, bytes]]) -> Iterator[Item | RowResult]:
        """The rows of one read batch: a request to send (the first row asking it), or a row answered
        without one (an identical row's answer, the cache's); a row asking what is in flight waits for it."""
        dedup = self.dedup
        stored: dict[bytes, bytes] = {}
        if self.cache is not None:
            new = [k for _, k in items if k not in dedup.waiting and k not in dedup.recent]
            cache = self.cache
            stored = self._guard(lambda: cache.get_many(new)) or {} if new else {}
        for item, key in items:
            waiting = dedup.waiting.get(key)
            if waiting is not None:
                waiting.append((item.row, item.rid))
                continue
            known = dedup.answer(key)
            if known is not None:
                self.deduplicated += 1
                yield reused(known, item.row, item.rid)
                continue
            body = stored.get(key)
            hit = self._from_cache(item, body) if body is not None else None
            if hit is not None:
                self.hits += 1
                dedup.remember(key, hit)
                yield hit
                continue
            dedup.waiting[key], dedup.leaders[item.row] = [], key
            yield item

    def _from_cache(self, item: Item, body: bytes) -> RowResult | None:
        """Row ``item``'s result from a stored answer, parsed by the job like a fresh one; None when the job
        refuses it (the request is then sent)."""
        try:
            data = fastjson.loads(body)
            outputs = self.parse(data)
        except Exception:
            return None
        raw = body.decode() if self.keep_raw else None
        return RowResult(item.row, item.rid, STATUS_OK, None, 200, 0, 0, 0.0, 0, outputs, raw)

    def settle(self, result: RowResult) -> list[RowResult]:
        """A finished row: when its request was one others waited for, their results (same answer); its
        answer is kept (memory, and the cache when the answer is a 200 the job accepted)."""
        key = self.dedup.leaders.pop(result.row, None)
        if key is None:
            return []
        waiting = self.dedup.waiting.pop(key, [])
        if result.status == STATUS_OK:
            if self.cache is not None and result.raw is not None and result.http_status == 200:
                self.cache.put(key, result.raw.encode())
            self.dedup.remember(key, result)
        if not self.keep_raw:
            result.raw = None  # kept only for the cache
        self.deduplicated += len(waiting)
        return [reused(result, row, rid) for row, rid in waiting]

    def counts(self) -> dict[str, int]:
        """This run's rows answered without a request: from the cache, and by an identical row's request."""
        return {"cache_hits": self.hits, "deduplicated": self.deduplicated}

    def flush(self) -> None:
        """Write the answers collected to the cache."""
        if self.cache is not None:
            cache = self.cache
            self._guard(cache.flush)

    def close(self) -> None:
        if self.cache is not None:
            cache, self.cache = self.cache, None
            try:
                cache.close()
            except (sqlite3.Error, OSError) as exc:
                log.warning("the response cache %s was not written (%s); the rows are in the ledger", cache.path, exc)

    def _guard(self, call: Any) -> Any:
        """``call()``; an error of the cache turns it off for this run (a warning), never fails a row."""
        try:
            return call()
        except (sqlite3.Error, OSError, zlib.error) as exc:
            log.warning("the response cache is off for the rest of this run: %s", exc)
            if self.cache is not None:
                old, self.cache = self.cache, None
                with contextlib.suppress(sqlite3.Error):
                    old.db.close()
            return None


# ---------------------------------------------------------------------------------------- submit side
def cache_fields(spec: JobSpec, settings: Settings | None = None) -> dict[str, Any]:
    """The spec's ``cache_dir`` and ``cache_max_bytes`` for submission: the settings' cache when the job's
    ``cache`` is true (or null and PREFECT_SWARM_CACHE on) and it runs on a swarm (an engine fingerprint);
    else none. A ``cache_dir`` the spec names already is kept."""
    if settings is None:
        from prefect_swarm.settings import get_settings

        settings = get_settings()
    on = spec.cache if spec.cache is not None else settings.cache
    if not on or not spec.swarm_fingerprint:
        return {"cache_dir": None, "cache_max_bytes": None}
    return {
        "cache_dir": spec.cache_dir or str(settings.cache_folder),
        "cache_max_bytes": spec.cache_max_bytes or int(settings.cache_max_gb * 1e9),
    }


def cache_info(folder: Path) -> dict[str, Any]:
    """What the cache in ``folder`` holds: entries, live and file bytes, hits, per engine fingerprint."""
    path = cache_db(folder)
    info: dict[str, Any] = {"path": str(path), "exists": path.exists(), "entries": 0, "bytes": 0, "hits": 0}
    info["fingerprints"] = []
    if not path.exists():
        return info
    with _reader(path) as db:
        fps = db.execute(
            "SELECT fingerprint, count(*), sum(size), sum(hits), max(used) FROM responses GROUP BY fingerprint "
            "ORDER BY fingerprint"
        ).fetchall()
        info["bytes"] = live_bytes(db)
    files = [path, path.with_name(path.name + "-wal")]
    info["file_bytes"] = sum(p.stat().st_size for p in files if p.exists())
    info["entries"] = sum(int(n) for _, n, *_ in fps)
    info["hits"] = sum(int(h or 0) for *_, h, _ in fps)
    info["fingerprints"] = [
        {"fingerprint": fp, "entries": int(n), "body_bytes": int(b or 0), "hits": int(h or 0), "last_used": u}
        for fp, n, b, h, u in fps
    ]
    return info


def cache_clear(folder: Path, fingerprint: str | None = None) -> int:
    """Drop every answer in the cache in ``folder`` (only ``fingerprint``'s when given) and give the space
    back; return how many were dropped. Safe while jobs use it (they see misses from then on)."""
    path = cache_db(folder)
    if not path.exists():
        return 0
    with _reader(path) as db, _Tx(db):
        if fingerprint is None:
            dropped = db.execute("DELETE FROM responses").rowcount
        else:
            dropped = db.execute("DELETE FROM responses WHERE fingerprint = ?", (fingerprint,)).rowcount
    with _reader(path) as db:
        try:
            db.execute("VACUUM")  # a job holding a read transaction delays this; the rows are gone either way
        except sqlite3.OperationalError as exc:
            log.info("the cache file was not compacted (%s); its free pages are reused", exc)
    return int(dropped)


class _reader:
    """A connection to an existing cache database, closed on exit."""

    def __init__(self, path: Path) -> None:
        self.db, _ = _connect(path)

    def __enter__(self) -> sqlite3.Connection:
        return self.db

    def __exit__(self, *_: object) -> None:
        self.db.close()
