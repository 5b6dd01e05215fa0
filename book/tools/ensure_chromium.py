"""Find the Chromium the browser tests drive, and say which one it is.

In order:

1. ``POSENC_CHROMIUM``, when set: the path of any Chromium or Chrome binary (an explicit choice wins);
2. Debian's Chromium, ``/usr/bin/chromium``, where it is installed;
3. the Chromium that ``python -m playwright install chromium`` downloaded into Playwright's own cache.

Run from the repository root as ``python -m book.tools.ensure_chromium`` (``make browser`` does), it prints
which one, and when there is none it gets one: Debian's ``chromium`` package where it may (root with apt-get, as
on CI), otherwise ``playwright install chromium``, which needs no root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DEBIAN_CHROMIUM = Path("/usr/bin/chromium")


def playwright_chromium() -> Path | None:
    """The Chromium of ``playwright install chromium``, if it is installed."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    with sync_playwright() as playwright:
        path = Path(playwright.chromium.executable_path)
    return path if path.is_file() else None


def find_chromium() -> tuple[str | None, str]:
    """``(executable_path, description)``; ``executable_path`` is None for Playwright's own (it picks it itself).

    Raises FileNotFoundError, naming the three ways to get one, when there is none.
    """
    chosen = os.environ.get("POSENC_CHROMIUM")
    if chosen:
        if not Path(chosen).is_file():
            raise FileNotFoundError(f"POSENC_CHROMIUM={chosen} is not a file: set it to a Chromium binary or unset it")
        return chosen, f"POSENC_CHROMIUM ({chosen})"
    if DEBIAN_CHROMIUM.is_file():
        return str(DEBIAN_CHROMIUM), f"Debian's Chromium ({DEBIAN_CHROMIUM})"
    own = playwright_chromium()
    if own is not None:
        return None, f"Playwright's Chromium ({own})"
    raise FileNotFoundError(
        "no Chromium for the browser tests: install Debian's (apt-get install chromium), or run "
        f"`{sys.executable} -m playwright install chromium`, or set POSENC_CHROMIUM to a binary"
    )


def install() -> None:
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        print("ensure_chromium: no Chromium found; installing Debian's chromium with apt-get", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "chromium", "fonts-dejavu-core"],
            check=True,
            env=env,
        )
    else:
        print("ensure_chromium: no Chromium found; running `playwright install chromium`", flush=True)
        subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], check=True)


def main() -> int:
    try:
        path, description = find_chromium()
    except FileNotFoundError as error:
        if os.environ.get("POSENC_CHROMIUM"):
            raise SystemExit(f"ensure_chromium: {error}") from None
        install()
        path, description = find_chromium()
    if path is not None:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        if version.returncode:
            print(version.stderr, file=sys.stderr)
            raise SystemExit(f"ensure_chromium: {path} --version failed")
        description += f", {version.stdout.strip()}"
    print(f"ensure_chromium: the browser tests use {description}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
