"""Text for the demo's terminal and summary: lines wrapped to the terminal, floats rounded.

Both :mod:`simjob.demo_common` and :mod:`simjob.summary` use it, so neither imports the other's helpers.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from typing import Any

_LONG_DECIMAL = re.compile(r"(?<![\w.])(-?\d+\.\d{4,})(?![\d.])")


def width() -> int:
    return max(60, shutil.get_terminal_size((100, 24)).columns)


def tidy(text: str) -> str:
    """Long decimals rounded to 3 places (a float's noise says nothing to a reader)."""
    return _LONG_DECIMAL.sub(lambda m: f"{float(m[1]):.3f}", text)


def fit(prefix: str, text: str, cols: int | None = None) -> str:
    """``prefix + text`` wrapped at word boundaries to the terminal, continuation lines indented."""
    cols = cols or width()
    return textwrap.fill(
        tidy(text),
        width=cols,
        initial_indent=prefix,
        subsequent_indent=" " * min(len(prefix), 14),
        break_long_words=False,
        break_on_hyphens=False,
    )


def round_floats(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 3)
    if isinstance(v, dict):
        return {k: round_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [round_floats(x) for x in v]
    return v
