"""`python -m quotasched.services.web.screenshot OUT.png`: the README's picture of the live
web view, taken from `make demo`'s own story, so that it shows what a newcomer sees.

It runs `quotasched demo --serve` (the notebook story on an embedded stack, with its
projector), waits for the story's end and the WEB= address, waits until the projection has
the story's usage (the page's step lines), takes one screenshot with headless Chromium
(`--screenshot`: the page is rendered on the server, so no script needs to run first), and
stops the demo.  Chromium is found as the report finds it (QUOTASCHED_CHROMIUM overrides).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from quotasched.services.report import png as report_png

STORY_ENDED = "Serving the demo's queue q"
START_CEILING_S = 180.0  # the story takes ~15 s; generous for a busy machine
USAGE_CEILING_S = 60.0  # the projector follows the log a moment behind
STOP_CEILING_S = 30.0


class ScreenshotError(RuntimeError):
    pass


def _wait_for(what: str, ceiling_s: float, found, demo: subprocess.Popen, log: Path):
    deadline = time.monotonic() + ceiling_s
    while (value := found()) is None:
        if demo.poll() is not None:
            raise ScreenshotError(f"the demo ended before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise ScreenshotError(f"no {what} after {ceiling_s:g} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return value


def _web_address(log: Path) -> str | None:
    text = log.read_text(errors="replace")
    if STORY_ENDED not in text:
        return None
    return next((line.split("=", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("WEB=")), None)  # fmt: skip


def _usage_drawn(web: str) -> bool | None:
    """True once the projection has usage for the story's shares (qs1 and qs2 ran jobs)."""
    with urllib.request.urlopen(f"{web}/api/usage?name=q&window=15m", timeout=10) as answer:
        usage = json.load(answer)
    names = {series["quotaShareName"] for series in usage.get("series", ())}
    return True if {"qs1", "qs2"} <= names else None


def take(out: Path, width: int = 1280, height: int = 1500) -> None:
    binary = report_png.chromium()
    if binary is None:
        raise ScreenshotError(f"no headless Chromium (looked for "
                              f"{', '.join(report_png.CHROMIUM_NAMES)}; set QUOTASCHED_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="quotasched-screenshot-") as tmp:
        log = Path(tmp) / "demo.log"
        with open(log, "wb") as sink:
            demo = subprocess.Popen(
                [sys.executable, "-m", "quotasched.services.cli.main", "demo", "--serve"],
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "COLUMNS": "200"})  # fmt: skip
        try:
            web = _wait_for("end of the story", START_CEILING_S, lambda: _web_address(log),
                            demo, log)  # fmt: skip
            _wait_for("usage in the projection", USAGE_CEILING_S, lambda: _usage_drawn(web),
                      demo, log)  # fmt: skip
            out.parent.mkdir(parents=True, exist_ok=True)
            shot = subprocess.run(
                [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--user-data-dir={Path(tmp) / 'profile'}", "--force-device-scale-factor=1",
                 f"--window-size={width},{height}", f"--screenshot={out.resolve()}",
                 f"{web}/?job=med"],
                capture_output=True, timeout=120)  # fmt: skip
            if shot.returncode != 0 or not out.exists():
                raise ScreenshotError(f"{binary} took no screenshot (exit {shot.returncode}): "
                                      + shot.stderr.decode(errors="replace")[-1000:])  # fmt: skip
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGTERM)
            try:
                demo.wait(STOP_CEILING_S)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quotasched.services.web.screenshot",
                                     description="Screenshot the live web view after the demo's "
                                                 "story (the README's docs/web-view.png).")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1500)
    args = parser.parse_args(argv)
    try:
        take(args.out, args.width, args.height)
    except ScreenshotError as error:
        print(f"screenshot: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
