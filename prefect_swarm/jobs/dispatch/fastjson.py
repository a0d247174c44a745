"""JSON on the per-row hot path: orjson when it is importable (it comes with Prefect), else the stdlib.

Both directions fall back to the stdlib for whatever orjson refuses, so what is accepted is what
``json`` accepts: non-string keys, integers beyond 64 bits, ``NaN``/``Infinity`` literals in an
answer, and datetimes and dataclasses are refused in a request body as the stdlib refuses them.
Differences in output: non-ASCII text is sent as UTF-8 rather than ``\\u`` escapes (the same JSON
value), a float NaN/inf in a request becomes ``null`` (the stdlib writes ``NaN``, which is not JSON
and which an engine refuses), and a ``uuid.UUID`` is sent as its string.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - orjson ships with prefect
    orjson = None  # type: ignore[assignment]


def _std_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


if orjson is not None:
    _orjson_dumps, _orjson_loads, _DecodeError = orjson.dumps, orjson.loads, orjson.JSONDecodeError
    _OPTS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS

    def dumps(obj: Any) -> bytes:
        """Compact JSON bytes of ``obj``."""
        try:
            return _orjson_dumps(obj, option=_OPTS)
        except TypeError:  # non-str keys, huge ints, datetimes, ...: let the stdlib decide
            return _std_dumps(obj)

    def loads(data: bytes) -> Any:
        """The value of the JSON in ``data``."""
        try:
            return _orjson_loads(data)
        except _DecodeError:  # NaN literals, ...: the stdlib accepts them or says what is wrong
            return json.loads(data)

else:  # pragma: no cover
    dumps = _std_dumps
    loads = json.loads
