"""The built site in a real headless Chromium (Debian's, driven by playwright, loopback only): every
page of the navigation loads with its title, every stylesheet, script and image it asks for is
served, no console error; screenshots of the Getting-started pages are left in the test's folder."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from prefect_swarm.testing import free_port

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [pytest.mark.slow]


def test_every_page_loads_in_a_browser(tmp_path: Path) -> None:
    assert CHROMIUM.exists(), "no /usr/bin/chromium: `make setup` (scripts/slurm/ci-up.sh) installs Debian's chromium"
    from playwright.sync_api import sync_playwright

    site = tmp_path / "site"
    mkdocs = Path(sys.executable).with_name("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([str(mkdocs), "build", "--strict", "-d", str(site)], cwd=REPO, env=env, capture_output=True)
    assert built.returncode == 0, built.stderr[-3000:]
    pages = sorted(p.parent.relative_to(site).as_posix() for p in site.rglob("index.html") if "search" not in p.parts)
    port = free_port()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bad: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox"])
            tab = browser.new_page()
            tab.on("console", lambda m: bad.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            tab.on("response", lambda r: bad.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            tab.on(  # e.g. a third party's font; not the search worker's fetch that the next page load aborts
                "requestfailed",
                lambda r: None if "ERR_ABORTED" in (r.failure or "") else bad.append(f"{r.failure}: {r.url}"),
            )
            for page in pages:
                url = f"http://127.0.0.1:{port}/{'' if page == '.' else page + '/'}"
                tab.goto(url, wait_until="load")
                assert tab.title().endswith("prefect-swarm"), (url, tab.title())
                assert tab.locator("article h1").count() == 1, url
                if page.startswith("getting-started"):
                    tab.screenshot(path=str(tmp_path / f"{page.replace('/', '-')}.png"), full_page=True)
            browser.close()
    finally:
        server.shutdown()
    assert not bad, bad
    assert len(pages) >= 25, pages
    print(f"{len(pages)} pages loaded; screenshots in {tmp_path}")
