"""The PNG: a screenshot of the report's HTML taken by headless Chromium, when one is
installed ($QUOTASCHED_CHROMIUM overrides the search).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .model import ReportError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
                  "chrome", "headless_shell")  # fmt: skip


def chromium() -> str | None:
    """The headless browser that turns the HTML into a PNG, if one is installed
    ($QUOTASCHED_CHROMIUM overrides the search)."""
    for name in (os.environ.get("QUOTASCHED_CHROMIUM"), *CHROMIUM_NAMES):
        if name:
            found = shutil.which(name)
            if found:
                return found
    return None


def no_chromium(png_path: str) -> ReportError:
    return ReportError(
        f"cannot write {png_path}: a PNG is rendered by headless Chromium and none is "
        f"installed (looked for {', '.join(CHROMIUM_NAMES)}; set QUOTASCHED_CHROMIUM to "
        "its path). Write the report as HTML instead: --out report.html")  # fmt: skip


def html_to_png(html_path: str, png_path: str, height: int, width: int = 1240) -> None:
    binary = chromium()
    if binary is None:
        raise no_chromium(png_path)
    target = os.path.abspath(png_path)
    if os.path.exists(target):
        os.remove(target)
    with tempfile.TemporaryDirectory(prefix="quotasched-chromium-") as profile:
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--force-device-scale-factor=1", "--default-background-color=ffffffff",
                   f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   f"--screenshot={target}", Path(os.path.abspath(html_path)).as_uri()]  # fmt: skip
        try:
            result = subprocess.run(command, capture_output=True, timeout=180)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ReportError(f"{binary} failed to render {png_path}: {error}") from None
    if not os.path.exists(target) or not os.path.getsize(target):
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise ReportError(f"{binary} did not write {png_path} (exit {result.returncode}): "
                          + " | ".join(tail))  # fmt: skip
