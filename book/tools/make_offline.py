"""Make the built book (_build/html) work with no network, then prove it does not reach out.

1. MathJax: the pinned npm package ``mathjax@MATHJAX_VERSION`` is fetched once with ``npm pack`` into
   _build/cache (its sha512 checked against the pinned one) and its ``es5/`` bundle, fonts and on-demand
   extensions included, is copied to ``_build/html/_static/mathjax``. _config.yml points Sphinx there with
   ``mathjax_path: mathjax/tex-mml-chtml.js`` (relative paths are relative to ``_static``).
2. Audit: every HTML page and CSS file is scanned for resources a browser would load by itself (scripts,
   style sheets, preloads, images, frames, media, CSS ``url()`` and ``@import``). Any remote one, or a
   local one whose file is missing, fails the build with the page and the URL. Links a reader clicks
   (Colab, GitHub) are not loads and stay. What scripts load at run time (MathJax's fonts and extensions)
   is checked in the browser tests, which abort and report any request that leaves localhost.

Run by build_html.py after ``jupyter-book build``; ``make_offline.py --audit-only`` skips step 1.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from book_files import ROOT  # noqa: E402

HTML_DIR = ROOT / "_build" / "html"
CACHE_DIR = ROOT / "_build" / "cache"
MATHJAX_VERSION = "3.2.2"
MATHJAX_INTEGRITY = "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
MATHJAX_PATH = "mathjax/tex-mml-chtml.js"  # relative to _static; must equal sphinx.config.mathjax_path

# <tag attribute> pairs whose URL the browser fetches without a click
LOADING_ATTRIBUTES = {
    "script": ("src",), "img": ("src", "srcset"), "source": ("src", "srcset"), "iframe": ("src",),
    "frame": ("src",), "embed": ("src",), "object": ("data",), "video": ("src", "poster"), "audio": ("src",),
    "track": ("src",), "input": ("src",),
}
LOADING_LINK_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "shortcut", "apple-touch-icon",
                     "manifest", "mask-icon"}
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""")


def ensure_npm() -> str:
    """Path of npm; installs Debian's npm when it is missing and we may (root)."""
    npm = shutil.which("npm")
    if npm:
        return npm
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "npm"], check=True, env=env)
        npm = shutil.which("npm")
    if not npm:
        raise SystemExit("make_offline: npm is needed to fetch MathJax (apt-get install npm)")
    return npm


def integrity_of(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode("ascii")


def mathjax_tarball() -> Path:
    """The pinned MathJax npm tarball in _build/cache, fetched with ``npm pack`` when absent."""
    tarball = CACHE_DIR / f"mathjax-{MATHJAX_VERSION}.tgz"
    if tarball.exists() and integrity_of(tarball) == MATHJAX_INTEGRITY:
        return tarball
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tarball.unlink(missing_ok=True)
    subprocess.run([ensure_npm(), "pack", f"mathjax@{MATHJAX_VERSION}", "--pack-destination", str(CACHE_DIR),
                    "--silent"], check=True, stdout=subprocess.DEVNULL)
    found = integrity_of(tarball)
    if found != MATHJAX_INTEGRITY:
        tarball.unlink()
        raise SystemExit(f"make_offline: mathjax-{MATHJAX_VERSION}.tgz has integrity {found}, "
                         f"expected {MATHJAX_INTEGRITY}")
    return tarball


def install_mathjax(html_dir: Path = HTML_DIR) -> Path:
    """Copy MathJax's es5 bundle into ``<html_dir>/_static/mathjax``; return that folder."""
    target = html_dir / "_static" / "mathjax"
    if target.exists():
        shutil.rmtree(target)
    prefix = "package/es5/"
    with tarfile.open(mathjax_tarball()) as archive:
        for member in archive.getmembers():
            if not member.isfile() or not member.name.startswith(prefix):
                continue
            relative = Path(member.name[len(prefix):])
            if relative.is_absolute() or ".." in relative.parts:
                raise SystemExit(f"make_offline: unsafe path in the MathJax tarball: {member.name}")
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.extractfile(member) as source, open(destination, "wb") as out:
                shutil.copyfileobj(source, out)
    if not (target / "tex-mml-chtml.js").exists():
        raise SystemExit("make_offline: the MathJax tarball has no es5/tex-mml-chtml.js")
    return target


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
    return sorted(p for p in html_dir.rglob("*.html")
                  if p.is_file() and p.relative_to(html_dir).parts[0] not in ("_static", "_sources"))


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
    parser.add_argument("--audit-only", action="store_true", help="check, do not install MathJax")
    args = parser.parse_args(argv)
    if not (args.html_dir / "index.html").exists():
        raise SystemExit(f"make_offline: no built book in {args.html_dir}")
    if configured_mathjax_path() != MATHJAX_PATH:
        raise SystemExit(f"make_offline: _config.yml must set sphinx.config.mathjax_path: {MATHJAX_PATH} "
                         f"(found {configured_mathjax_path()!r})")
    if not args.audit_only:
        target = install_mathjax(args.html_dir)
        size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
        print(f"make_offline: MathJax {MATHJAX_VERSION} in {target.relative_to(ROOT)} ({size / 1e6:.1f} MB)")
    failures = audit(args.html_dir) + check_mathjax_pages(args.html_dir)
    if failures:
        print("make_offline: the book would not work offline:", *failures, sep="\n  ", file=sys.stderr)
        return 1
    pages = len(site_pages(args.html_dir))
    print(f"make_offline: {pages} pages checked, every resource they load is local")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
