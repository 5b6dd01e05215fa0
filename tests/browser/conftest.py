"""Browser tests of the built book: _build/html served on 127.0.0.1, driven by Debian's Chromium via Playwright.

Build first (``make book``); ``book/tools/ensure_chromium.py`` installs the browser. Every request that would
leave localhost is aborted and recorded, so a test fails instead of reaching the network.
"""
from __future__ import annotations

import functools
import http.server
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book" / "tools"))
from book_files import toc_entries  # noqa: E402

HTML_DIR = ROOT / "_build" / "html"
SCREENSHOT_DIR = ROOT / "_build" / "screenshots"
WEIGHTS_FILE = ROOT / "_build" / "page-weights.txt"
CHROMIUM = os.environ.get("POSENC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
MB = 1_000_000
WEIGHT_LIMIT = 8 * MB
WEIGHT_TARGET = 4 * MB

weights_key = pytest.StashKey[dict]()


@dataclass(frozen=True)
class BookPage:
    """One page of _toc.yml whose source exists: ``entry`` is its path without suffix."""

    entry: str

    @property
    def is_notebook(self) -> bool:
        return (ROOT / f"{self.entry}.ipynb").exists()

    @property
    def html(self) -> str:
        return f"{self.entry}.html"

    def __str__(self) -> str:
        return self.entry


def book_pages() -> list[BookPage]:
    """The pages of _toc.yml in reading order, those whose .ipynb or .md source exists."""
    return [BookPage(entry) for entry in toc_entries()
            if (ROOT / f"{entry}.ipynb").exists() or (ROOT / f"{entry}.md").exists()]


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("data", "blob", "about") or (parts.hostname or "") in LOCAL_HOSTS


def local_file(url: str) -> Path | None:
    """The file under _build/html that a local URL is served from."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname not in LOCAL_HOSTS:
        return None
    path = HTML_DIR / unquote(parts.path).lstrip("/")
    if path.is_dir():
        path = path / "index.html"
    return path if path.is_file() else None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class names it so
        pass


@dataclass
class Traffic:
    """What a browser page did: console errors, page errors, failed and remote requests, loaded files."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    remote_requests: list[str] = field(default_factory=list)
    loaded: dict[str, int] = field(default_factory=dict)  # local URL path -> bytes served

    def problems(self) -> list[str]:
        return ([f"console error: {m}" for m in self.console_errors]
                + [f"page error: {m}" for m in self.page_errors]
                + [f"failed request: {m}" for m in self.failed_requests]
                + [f"request leaving localhost (aborted): {m}" for m in self.remote_requests])

    @property
    def weight(self) -> int:
        return sum(self.loaded.values())


def watch(context_or_page, page, traffic: Traffic) -> None:
    """Record ``page``'s traffic into ``traffic``; abort every request that is not to localhost."""

    def route(route):
        url = route.request.url
        if is_local(url):
            route.continue_()
        else:
            traffic.remote_requests.append(url)
            route.abort("blockedbyclient")

    def on_response(response):
        url = response.url
        if response.status >= 400:
            traffic.failed_requests.append(f"{url} (HTTP {response.status})")
            return
        file = local_file(url)
        if file is not None:
            traffic.loaded[urlsplit(url).path] = file.stat().st_size

    def on_failed(request):
        if request.url not in traffic.remote_requests:
            traffic.failed_requests.append(f"{request.url} ({request.failure})")

    def on_console(message):
        if message.type == "error":
            location = message.location or {}
            traffic.console_errors.append(f"{message.text} [{location.get('url', '')}:{location.get('lineNumber', '')}]")

    context_or_page.route("**/*", route)
    page.on("response", on_response)
    page.on("requestfailed", on_failed)
    page.on("console", on_console)
    page.on("pageerror", lambda error: traffic.page_errors.append(str(error)))


@pytest.fixture(scope="session")
def site() -> Path:
    if not (HTML_DIR / "index.html").exists():
        pytest.fail(f"no built book in {HTML_DIR}: run `make book` first")
    return HTML_DIR


@pytest.fixture(scope="session")
def base_url(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run book/tools/ensure_chromium.py (make browser does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
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


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    weights = config.stash.get(weights_key, {})
    if not weights:
        return
    lines = [f"{'page':40s} {'weight':>10s}  files  status"]
    for entry, (weight, files) in weights.items():
        status = ("OVER 8 MB LIMIT" if weight > WEIGHT_LIMIT else "over 4 MB target" if weight > WEIGHT_TARGET
                  else "ok")
        lines.append(f"{entry:40s} {weight / MB:8.2f} MB  {files:5d}  {status}")
    lines.append(f"{'total':40s} {sum(w for w, _ in weights.values()) / MB:8.2f} MB")
    terminalreporter.section("page weights (HTML + every file it loads)")
    for line in lines:
        terminalreporter.write_line(line)
    WEIGHTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    WEIGHTS_FILE.write_text("\n".join(lines) + "\n")
