"""Browser tests of the built book: _build/html served on 127.0.0.1, driven by Chromium via Playwright.

Build first (``make book``). The browser is POSENC_CHROMIUM if set, else Debian's Chromium where installed, else
Playwright's own (``book/tools/ensure_chromium.py`` says which, and gets one when there is none). Every request
that would leave localhost is aborted and recorded, so a test fails instead of reaching the network.
"""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest
from browser_support import CHROMIUM_ARGS, DESKTOP, FACTS_FILE, HTML_DIR, MB, WEIGHT_LIMIT, WEIGHTS_FILE, Traffic, watch

from book.tools.ensure_chromium import find_chromium

weights_key = pytest.StashKey[dict]()
facts_key = pytest.StashKey[dict]()
browser_key = pytest.StashKey[str]()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class names it so
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A browser that drops a request it no longer needs (a slider moved on) is not a server error."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


@pytest.fixture(scope="session")
def site() -> Path:
    if not (HTML_DIR / "index.html").exists():
        pytest.fail(f"no built book in {HTML_DIR}: run `make book` first")
    return HTML_DIR


@pytest.fixture(scope="session")
def base_url(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser(request):
    from playwright.sync_api import sync_playwright

    try:
        executable, description = find_chromium()
    except FileNotFoundError as error:
        pytest.fail(f"{error} (book/tools/ensure_chromium.py gets one; make browser runs it)")
    request.config.stash[browser_key] = description
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def open_page(browser):
    """``open_page(url, viewport=DESKTOP) -> (page, traffic)``: a fresh context, watched; closed afterwards."""
    contexts = []

    def open_(url: str, viewport=DESKTOP, wait_until="load"):
        context = browser.new_context(viewport=viewport, service_workers="block")
        contexts.append(context)
        page = context.new_page()
        traffic = Traffic()
        watch(context, page, traffic)
        response = page.goto(url, wait_until=wait_until)
        assert response is not None and response.ok, f"{url}: HTTP {response.status if response else 'no response'}"
        return page, traffic

    yield open_
    for context in contexts:
        context.close()


@pytest.fixture(scope="session")
def page_weights(request) -> dict:
    return request.config.stash.setdefault(weights_key, {})


@pytest.fixture(scope="session")
def page_facts(request) -> dict:
    """page -> what the reader-facing checks measured (written to _build/page-facts.txt)."""
    return request.config.stash.setdefault(facts_key, {})


def _write_facts(terminalreporter, facts: dict) -> None:
    columns = ("code share", "min img ratio", "weight MB", "min fig text px (1280)", "(390)")
    lines = [f"{'page':34s} " + " ".join(f"{c:>14s}" for c in columns)]
    for entry, row in facts.items():
        cells = [
            f"{row['code_share']:.1%}" if row.get("code_share") is not None else "-",
            f"{row['min_ratio']:.2f}" if row.get("min_ratio") is not None else "-",
            f"{row['weight'] / MB:.2f}" if row.get("weight") is not None else "-",
            f"{row['min_text_px']:.1f}" if row.get("min_text_px") is not None else "-",
            f"{row['min_text_px_phone']:.1f}" if row.get("min_text_px_phone") is not None else "-",
        ]
        lines.append(f"{entry:34s} " + " ".join(f"{c:>14s}" for c in cells))
    terminalreporter.section("what a reader sees, per page (see tests/browser/test_pages.py)")
    for line in lines:
        terminalreporter.write_line(line)
    FACTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    FACTS_FILE.write_text("\n".join(lines) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if browser_key in config.stash:
        terminalreporter.write_line(f"browser: {config.stash[browser_key]}")
    facts = config.stash.get(facts_key, {})
    if facts:
        _write_facts(terminalreporter, facts)
    weights = config.stash.get(weights_key, {})
    if not weights:
        return
    lines = [f"{'page':34s} {'total':>9s} {'its HTML':>9s} {'gzipped':>9s} {'files':>5s}  status"]
    for entry, row in weights.items():
        status = f"OVER THE {WEIGHT_LIMIT / MB:.0f} MB LIMIT" if row["total"] > WEIGHT_LIMIT else "ok"
        lines.append(
            f"{entry:34s} {row['total'] / MB:6.2f} MB {row['html'] / MB:6.2f} MB {row['gzip'] / MB:6.2f} MB "
            f"{row['files']:5d}  {status}"
        )
    terminalreporter.section("page weights (MB = 10^6 bytes; total = the HTML + every file it loads, uncompressed)")
    for line in lines:
        terminalreporter.write_line(line)
    WEIGHTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    WEIGHTS_FILE.write_text("\n".join(lines) + "\n")
