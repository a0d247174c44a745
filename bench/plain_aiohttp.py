"""The baseline: a plain aiohttp loop, C workers posting chat completions back to back.

    python bench/plain_aiohttp.py --url URL --n ROWS --concurrency C

Prints one JSON line: rows, seconds (first request to last answer), rows_s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp


async def main(url: str, n: int, c: int) -> None:
    """Send ``n`` requests with ``c`` in flight."""
    rows = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as session:

        async def worker() -> None:
            for i in rows:
                body = {
                    "model": "stub-model",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": f"question {i:08d} about a topic"}],
                }
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    resp.raise_for_status()
                    await resp.json()

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(c)))
        dt = time.monotonic() - t0
    print(json.dumps({"rows": n, "seconds": round(dt, 3), "rows_s": round(n / dt, 1)}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--concurrency", type=int, default=256)
    a = ap.parse_args()
    asyncio.run(main(a.url, a.n, a.concurrency))
