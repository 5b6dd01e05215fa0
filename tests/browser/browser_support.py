"""What the browser tests share: the book's pages, the local-only network guard, the limits."""

from __future__ import annotations

import functools
import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from book.tools.book_files import ROOT, toc_entries

HTML_DIR = Path(os.environ.get("POSENC_HTML_DIR", ROOT / "_build" / "html"))  # the built book under test
SCREENSHOT_DIR = ROOT / "_build" / "screenshots"
WEIGHTS_FILE = ROOT / "_build" / "page-weights.txt"
FACTS_FILE = ROOT / "_build" / "page-facts.txt"  # per page: code share, image sharpness, smallest figure text
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
MB = 1_000_000
WEIGHT_LIMIT = 4 * MB  # everything a page loads once scrolled to the bottom (lazy images included)
CODE_SHARE_LIMIT = 0.20  # visible input code / (that + the article's text without outputs)
MIN_IMAGE_RATIO = 2.0  # natural width / displayed width of every raster figure
MIN_FIGURE_TEXT_PX = 11.0  # smallest figure text at desktop width, in CSS px


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
    return [
        BookPage(entry)
        for entry in toc_entries()
        if (ROOT / f"{entry}.ipynb").exists() or (ROOT / f"{entry}.md").exists()
    ]


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


@dataclass
class Traffic:
    """What a browser page did: console errors, page errors, failed and remote requests, loaded files."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    remote_requests: list[str] = field(default_factory=list)
    loaded: dict[str, int] = field(default_factory=dict)  # local URL path -> bytes served

    def problems(self) -> list[str]:
        return (
            [f"console error: {m}" for m in self.console_errors]
            + [f"page error: {m}" for m in self.page_errors]
            + [f"failed request: {m}" for m in self.failed_requests]
            + [f"request leaving localhost (aborted): {m}" for m in self.remote_requests]
        )

    @property
    def weight(self) -> int:
        return sum(self.loaded.values())

    @property
    def gzip_weight(self) -> int:
        """What the same files weigh gzip-compressed, as most static hosts serve them."""
        return sum(gzipped_size(HTML_DIR / path.lstrip("/")) for path in self.loaded)


@functools.cache
def gzipped_size(path: Path) -> int:
    return len(gzip.compress(path.read_bytes(), compresslevel=6))


def watch(context, page, traffic: Traffic) -> None:
    """Record ``page``'s traffic into ``traffic``; ``context`` aborts every request that is not to localhost."""

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
        if request.resource_type == "image" and "ERR_ABORTED" in str(request.failure):
            return  # a slider moved on before its frame arrived: the browser drops the superseded load
        if request.url not in traffic.remote_requests:
            traffic.failed_requests.append(f"{request.url} ({request.failure})")

    def on_console(message):
        if message.type == "error":
            location = message.location or {}
            traffic.console_errors.append(
                f"{message.text} [{location.get('url', '')}:{location.get('lineNumber', '')}]"
            )

    context.route("**/*", route)
    page.on("response", on_response)
    page.on("requestfailed", on_failed)
    page.on("console", on_console)
    page.on("pageerror", lambda error: traffic.page_errors.append(str(error)))


PAGES_WITH_FIGURES = [page for page in book_pages() if page.is_notebook]  # every chapter has figures
