"""Headless Chromium for report tests: a screenshot and the rendered DOM of a local HTML file.

Chromium is found on PATH (``chromium``, ``chromium-browser``). Where it is missing the
calling test is skipped, except under ``CI`` (set by CI, as ``CI=1``), where it fails:
CI must install it (``apt-get install -y chromium``, as ci/check_html_report.sh does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "headless Chromium not found on PATH (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def render_in_chromium(page: Path, out: Path, *, width: int = 1280, height: int = 1600) -> tuple[Path, str]:
    """(screenshot PNG, DOM after rendering) of ``page`` opened from file:// with no server."""
    exe = chromium()
    png = out / (page.stem + ".png")
    url = page.resolve().as_uri()
    for args in ([f"--screenshot={png}", f"--window-size={width},{height}"], ["--dump-dom"]):
        profile = out / f"profile-{args[0].strip('-').split('=')[0]}"
        proc = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args, url], capture_output=True,
                              text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"chromium {args[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        if args[0] == "--dump-dom":
            dom = proc.stdout
    assert png.is_file(), f"chromium wrote no screenshot {png}"
    return png, dom
