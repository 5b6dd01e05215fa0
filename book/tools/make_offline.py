"""Check that the built book (_build/html) works with no network: every resource it loads is local.

1. MathJax: the PyPI package ``sphinx-mathjax-offline`` (a Sphinx extension listed in _config.yml, installed by
   requirements.txt) copies MathJax 3.2.2's ``es5`` bundle, fonts and on-demand extensions included, into
   ``_build/html/_static/mathjax`` when the build finishes. _config.yml points Sphinx there with
   ``mathjax_path: mathjax/tex-chtml.js`` (relative to ``_static``; the extension sets it, and _config.yml
   says the same so that no reader is misled). This script checks
   the bundle is there and is the version expected.
2. Audit: every HTML page and CSS file is scanned for resources a browser would load by itself (scripts,
   style sheets, preloads, images, frames, media, CSS ``url()`` and ``@import``). Any remote one, or a
   local one whose file is missing, fails the build with the page and the URL. Links a reader clicks
   (Colab, GitHub) are not loads and stay. What scripts load at run time (MathJax's fonts and extensions)
   is checked in the browser tests, which abort and report any request that leaves localhost.

Run by build_html.py after ``jupyter-book build``; alone: ``python -m book.tools.make_offline``.
"""

from __future__ import annotations

import argparse
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import yaml

from book.tools.book_files import ROOT

HTML_DIR = ROOT / "_build" / "html"
MATHJAX_VERSION = "3.2.2"  # what sphinx-mathjax-offline 0.0.2 ships
MATHJAX_EXTENSION = "sphinx-mathjax-offline"  # its module name, as listed in _config.yml
MATHJAX_PATH = "mathjax/tex-chtml.js"  # relative to _static; what sphinx-mathjax-offline sets (TeX in, HTML out)

# <tag attribute> pairs whose URL the browser fetches without a click
LOADING_ATTRIBUTES = {
    "script": ("src",),
    "img": ("src", "srcset"),
    "source": ("src", "srcset"),
    "iframe": ("src",),
    "frame": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "video": ("src", "poster"),
    "audio": ("src",),
    "track": ("src",),
    "input": ("src",),
}
LOADING_LINK_RELS = {
    "stylesheet",
    "preload",
    "modulepreload",
    "prefetch",
    "icon",
    "shortcut",
    "apple-touch-icon",
    "manifest",
    "mask-icon",
}
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""")


def check_mathjax_bundle(html_dir: Path = HTML_DIR) -> list[str]:
    """Problems with the MathJax copied into ``<html_dir>/_static/mathjax`` by sphinx-mathjax-offline."""
    entry = html_dir / "_static" / MATHJAX_PATH
    if not entry.is_file():
        return [
            f"_static/{MATHJAX_PATH} is missing: is {MATHJAX_EXTENSION} installed (pip install -r "
            f"requirements.txt) and listed in _config.yml under sphinx.extra_extensions?"
        ]
    if f'"{MATHJAX_VERSION}"' not in entry.read_text(encoding="utf-8", errors="replace"):
        return [f"_static/{MATHJAX_PATH} is not MathJax {MATHJAX_VERSION}"]
    fonts = html_dir / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    return [] if any(fonts.glob("*.woff")) else [f"{fonts.relative_to(html_dir)} has no fonts"]


def configured_extensions(root: Path = ROOT) -> list[str]:
    config = yaml.safe_load((root / "_config.yml").read_text())
    return list((config.get("sphinx") or {}).get("extra_extensions") or [])


def configured_mathjax_path(root: Path = ROOT) -> str | None:
    config = yaml.safe_load((root / "_config.yml").read_text())
    return ((config.get("sphinx") or {}).get("config") or {}).get("mathjax_path")


class _LoadedURLs(HTMLParser):
    """Collects the URLs a page loads by itself, and the contents of its inline <style> blocks."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "link":
            rels = set((attrs.get("rel") or "").lower().split())
            if rels & LOADING_LINK_RELS and attrs.get("href"):
                self.urls.append(attrs["href"])
        for name in LOADING_ATTRIBUTES.get(tag, ()):
            value = attrs.get(name)
            if not value:
                continue
            if name == "srcset":
                self.urls.extend(part.strip().split()[0] for part in value.split(",") if part.strip())
            else:
                self.urls.append(value)
        if attrs.get("style"):
            self.urls.extend(css_urls(attrs["style"]))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.urls.extend(css_urls(data))


def css_urls(text: str) -> list[str]:
    return [a or b for a, b in CSS_URL.findall(text)]


def problems_with(url: str, base: str, html_dir: Path) -> str | None:
    """Why loading ``url`` (found in the file at site path ``base``) breaks offline, or None."""
    if url.startswith(("data:", "#", "about:", "blob:")):
        return None
    resolved = urljoin(f"http://offline.invalid/{base}", url)
    parts = urlsplit(resolved)
    if parts.netloc != "offline.invalid":
        return "remote"
    path = html_dir / unquote(parts.path).lstrip("/")
    if path.is_dir():
        path = path / "index.html"
    return None if path.is_file() else "missing file"


def site_pages(html_dir: Path = HTML_DIR) -> list[Path]:
    """The HTML pages of the site (not the theme's template snippets under _static or the sources)."""
    return sorted(
        p
        for p in html_dir.rglob("*.html")
        if p.is_file() and p.relative_to(html_dir).parts[0] not in ("_static", "_sources")
    )


def audit(html_dir: Path = HTML_DIR) -> list[str]:
    """Every resource load that would fail or leave the machine, as ``page: url (reason)`` lines."""
    failures = []
    files = sorted(site_pages(html_dir) + [p for p in html_dir.rglob("*.css") if p.is_file()])
    for file in files:
        base = file.relative_to(html_dir).as_posix()
        text = file.read_text(encoding="utf-8", errors="replace")
        if file.suffix == ".css":
            urls = css_urls(text)
        else:
            parser = _LoadedURLs()
            parser.feed(text)
            urls = parser.urls
        for url in urls:
            reason = problems_with(url.strip(), base, html_dir)
            if reason:
                failures.append(f"{base}: {url} ({reason})")
    return failures


def check_mathjax_pages(html_dir: Path = HTML_DIR) -> list[str]:
    """Pages with math must load the local MathJax."""
    failures = []
    for page in site_pages(html_dir):
        text = page.read_text(encoding="utf-8", errors="replace")
        if 'class="math' in text and f"_static/{MATHJAX_PATH}" not in text:
            failures.append(f"{page.relative_to(html_dir)}: has math but does not load _static/{MATHJAX_PATH}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html-dir", type=Path, default=HTML_DIR)
    args = parser.parse_args(argv)
    if not (args.html_dir / "index.html").exists():
        raise SystemExit(f"make_offline: no built book in {args.html_dir}")
    if configured_mathjax_path() != MATHJAX_PATH:
        raise SystemExit(
            f"make_offline: _config.yml must set sphinx.config.mathjax_path: {MATHJAX_PATH} "
            f"(found {configured_mathjax_path()!r})"
        )
    if MATHJAX_EXTENSION not in configured_extensions():
        raise SystemExit(f"make_offline: _config.yml must list {MATHJAX_EXTENSION} in sphinx.extra_extensions")
    failures = check_mathjax_bundle(args.html_dir) + audit(args.html_dir) + check_mathjax_pages(args.html_dir)
    if failures:
        print("make_offline: the book would not work offline:", *failures, sep="\n  ", file=sys.stderr)
        return 1
    pages = len(site_pages(args.html_dir))
    print(f"make_offline: MathJax {MATHJAX_VERSION} bundled; {pages} pages checked, every resource they load is local")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
