"""The PNG: a screenshot of the report's HTML taken by headless Chromium, when one is
installed ($QUOTASCHED_CHROMIUM overrides the search), cropped to the content.

Chromium is run twice: `--dump-dom` first, to read the height of the content that the page's
script writes on <html data-content-height> once the charts are drawn (their boxes have fixed
heights, so the layout does not depend on the window's), and the width of the widest table
(`data-content-width`), then `--screenshot` with a window exactly that high and at least that
wide.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .model import ReportError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
                  "chrome", "headless_shell")  # fmt: skip
WIDTH = 1240
MAX_HEIGHT = 30000  # Chromium's screenshots fail past a few tens of thousands of pixels
MAX_WIDTH = 4000


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


def _run(binary: str, args: list[str], png_path: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="quotasched-chromium-") as profile:
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--force-device-scale-factor=1", "--default-background-color=ffffffff",
                   f"--user-data-dir={profile}", *args]  # fmt: skip
        try:
            return subprocess.run(command, capture_output=True, timeout=180)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ReportError(f"{binary} failed to render {png_path}: {error}") from None


def content_size(binary: str, page_uri: str, png_path: str) -> tuple[int, int]:
    """(width, height) of the drawn report: at least the window's width (a table wider than
    it widens the screenshot instead of being cut), and the content's height."""
    dumped = _run(binary, [f"--window-size={WIDTH},900", "--dump-dom", page_uri], png_path)
    found = re.search(rb'data-content-height="(\d+)"', dumped.stdout)
    if found is None:
        tail = dumped.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise ReportError(f"{binary} did not draw the report for {png_path} (exit "
                          f"{dumped.returncode}): " + " | ".join(tail))  # fmt: skip
    wide = re.search(rb'data-content-width="(\d+)"', dumped.stdout)
    width = max(WIDTH, min(int(wide.group(1)), MAX_WIDTH)) if wide else WIDTH
    return width, min(int(found.group(1)), MAX_HEIGHT)


def html_to_png(html_path: str, png_path: str) -> None:
    binary = chromium()
    if binary is None:
        raise no_chromium(png_path)
    target = os.path.abspath(png_path)
    if os.path.exists(target):
        os.remove(target)
    page = Path(os.path.abspath(html_path)).as_uri()
    width, height = content_size(binary, page, png_path)
    result = _run(binary, [f"--window-size={width},{height}", f"--screenshot={target}", page],
                  png_path)  # fmt: skip
    if not os.path.exists(target) or not os.path.getsize(target):
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise ReportError(f"{binary} did not write {png_path} (exit {result.returncode}): "
                          + " | ".join(tail))  # fmt: skip
