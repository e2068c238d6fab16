"""Small SVG symbols the page and the charts share: the hatch patterns (one per share colour,
defined once per page), preemption marker shapes, and the legend swatches.
"""

from __future__ import annotations

from .formatting import _num
from .model import Report
from .style import DARK, MARKER, OTHER_REASON, PALETTE, REASONS


def _defs(report: Report) -> str:
    """Hatch patterns, one per share colour (userSpaceOnUse: they line up across rects)."""
    out = ['<svg class="defs" width="0" height="0" aria-hidden="true"><defs>']
    for index, (hue, dark) in enumerate(zip(PALETTE, DARK)):
        out.append(
            f'<pattern id="hatch-{index}" patternUnits="userSpaceOnUse" width="7" height="7" '
            f'patternTransform="rotate(45)"><rect width="7" height="7" fill="{hue}" '
            f'fill-opacity="0.35"/><rect width="3.2" height="7" fill="{dark}"/></pattern>'
        )  # fmt: skip
    out.append("</defs></svg>")
    return "".join(out)


def _marker_shape(shape: str, x: float, y: float, colour: str) -> str:
    """A marker whose top touches y (the time axis) and is centred on x."""
    r = MARKER / 2
    if shape == "triangle":
        pts = [(x, y), (x + r, y + MARKER), (x - r, y + MARKER)]
    elif shape == "diamond":
        pts = [(x, y), (x + r, y + r), (x, y + MARKER), (x - r, y + r)]
    else:
        return (f'<circle cx="{_num(x)}" cy="{_num(y + r)}" r="{_num(r - 0.5)}" '
                f'fill="{colour}" stroke="#fff" stroke-width="0.8"/>')  # fmt: skip
    points = " ".join(f"{_num(px)},{_num(py)}" for px, py in pts)
    return f'<polygon points="{points}" fill="{colour}" stroke="#fff" stroke-width="0.8"/>'


def _swatch(kind: str, colour: int | str) -> str:
    if kind == "own":
        body = f'<rect x="1" y="1" width="20" height="12" fill="{PALETTE[colour]}"/>'
    elif kind == "borrowed":
        body = (f'<rect x="1" y="1" width="20" height="12" fill="url(#hatch-{colour})" '
                f'stroke="{DARK[colour]}" stroke-width="0.6"/>')  # fmt: skip
    elif kind == "slot":
        body = (f'<rect x="1" y="1" width="20" height="12" fill="{PALETTE[colour]}" '
                f'fill-opacity="0.13"/><line x1="1" y1="1.5" x2="21" y2="1.5" '
                f'stroke="{DARK[colour]}" stroke-width="1.5" stroke-dasharray="4 2"/>')  # fmt: skip
    elif kind == "capacity":
        body = '<line x1="1" y1="7" x2="21" y2="7" stroke="#111" stroke-width="2.2"/>'
    else:  # a preemption reason
        colour_, shape, _ = REASONS.get(kind, OTHER_REASON)
        body = _marker_shape(shape, 11, 1.5, colour_)
    return f'<svg class="swatch" width="22" height="14" aria-hidden="true">{body}</svg>'
