"""Make sure Debian's Chromium is installed for the browser tests (``playwright install`` cannot download here).

Installs the ``chromium`` package with apt-get when /usr/bin/chromium is missing (needs root), then checks
that it starts and prints its version.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

CHROMIUM = os.environ.get("POSENC_CHROMIUM", "/usr/bin/chromium")


def install() -> None:
    if not shutil.which("apt-get"):
        raise SystemExit(f"{CHROMIUM} is missing and there is no apt-get: install Chromium and set POSENC_CHROMIUM")
    if os.geteuid() != 0:
        raise SystemExit(f"{CHROMIUM} is missing: run `sudo apt-get install -y chromium` (or this script as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "chromium", "fonts-dejavu-core"], check=True, env=env)


def main() -> int:
    if not os.path.exists(CHROMIUM):
        print(f"ensure_chromium: {CHROMIUM} not found, installing Debian's chromium", flush=True)
        install()
    version = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=60)
    if version.returncode:
        print(version.stderr, file=sys.stderr)
        raise SystemExit(f"ensure_chromium: {CHROMIUM} --version failed")
    print(f"ensure_chromium: {version.stdout.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
