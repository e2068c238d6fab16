"""Colours and sizes of the report: the constants the page and the chart data share.

MAX_EXACT_STEPS and AVERAGE_COLUMNS are read as `style.NAME` at call time (series.py), so a
test can lower them on this module.
"""

from __future__ import annotations

# Share colours, in creation order within a job queue (no red: red marks preemptions and
# usage over capacity).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
           "#ff9da7", "#8cd17d", "#bab0ac", "#1b9e77", "#7570b3", "#e7298a", "#a6761d",
           "#17becf", "#bcbd22", "#6b6ecf", "#d6616b", "#637939", "#ce6dbd")  # fmt: skip
CAPACITY = "#111111"
OVER = "#d62728"  # usage above the capacity line: red stripes ...
OVER_BACKGROUND = "#fde0df"  # ... on this opaque wash
REASONS = {  # preemption reason: (marker colour, words)
    "CROSS_SHARE_RECLAIM": ("#e6550d", "cross-share reclaim"),  # not red: over capacity is
    "IN_SHARE_PRIORITY": ("#6a3d9a", "in-share priority"),  # not black: the capacity line is
}
OTHER_REASON = ("#888888", None)

MAX_EXACT_STEPS = 1500  # a chart with more changes than this shows time averages per column
AVERAGE_COLUMNS = 600  # ... over this many equal columns (the instance-seconds stay exact)
