"""How the report writes quantities and text: instance-seconds for people, HTML escaping, and
a share's colour swatch (times are timeaxis.py's).
"""

from __future__ import annotations

import html
from typing import Any

from .style import PALETTE


def _qty(v: float) -> str:
    """Instance-seconds (or instances) for people: thousands separators, 1 decimal if needed."""
    if abs(v - round(v)) < 0.05:
        return f"{round(v):,}"
    return f"{v:,.1f}"


def _hours(v: float) -> str:
    return f"{v / 3600:,.2f} h"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _swatch(colour: int, hatched: bool = False) -> str:
    """A small square in a share's colour (hatched: its borrowed usage)."""
    css = PALETTE[colour]
    if hatched:
        css = (f"repeating-linear-gradient(135deg, {css} 0 2px, {css}33 2px 5px)")
    return f'<span class="swatch" style="background: {css}"></span>'
