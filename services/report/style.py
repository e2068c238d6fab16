"""Colours, marker shapes and chart geometry of the report: the constants every drawing module
shares (SVG user units = CSS pixels).

MAX_EXACT_STEPS is read as `style.MAX_EXACT_STEPS` at call time (frames.frames,
page.page_height), so a test can lower it on this module.
"""

from __future__ import annotations

# Share colours, in creation order within a job queue (no red: red marks preemptions).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
           "#ff9da7", "#8cd17d", "#bab0ac", "#1b9e77", "#7570b3", "#e7298a", "#a6761d",
           "#17becf", "#bcbd22", "#6b6ecf", "#d6616b", "#637939", "#ce6dbd")  # fmt: skip


def _darker(hex_colour: str, factor: float = 0.62) -> str:
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(c * factor):02x}" for c in rgb)


DARK = tuple(_darker(colour) for colour in PALETTE)  # lines and text in a share's colour
REASONS = {  # reason: (colour, shape, label)
    "CROSS_SHARE_RECLAIM": ("#d62728", "triangle", "cross-share reclaim"),
    "IN_SHARE_PRIORITY": ("#1f1f1f", "diamond", "in-share priority"),
}
OTHER_REASON = ("#888888", "circle", "other")

# Chart geometry (SVG user units = CSS pixels).
WIDTH, PLOT_H = 1120, 300
LEFT, RIGHT, TOP = 64, 190, 18
MARKER, MARKER_GAP = 11, 2
EPS = 1e-9
MIN_WIDTH = 1.5  # px: a borrowed piece stays visible however short it was
MAX_EXACT_STEPS = 1500  # more steps than this in a chart: draw time averages per pixel column
MAX_LANES = 3  # rows of preemption markers under the time axis
MAX_GUIDES = 40  # more preemptions than this in a chart: markers only, no guide lines
