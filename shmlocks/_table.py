"""Output for the command line: a table for people, JSON for scripts.

Every command prints through :func:`emit`: ``--json`` gives the records as JSON (one array or
object, nothing else on stdout), otherwise the command's own rendering, built from
:func:`table` and :func:`human_size`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """Left-aligned columns two spaces apart, a header line first; no trailing blanks."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in cells
    ]
    return "\n".join(lines)


def human_size(n: int) -> str:
    """A byte count for people: ``512 B``, ``4.0 KiB``, ``1.5 MiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def emit(data: Any, as_json: bool, render: Callable[[Any], str]) -> None:
    """Print ``data`` as indented JSON if ``as_json``, else ``render(data)`` for people."""
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        print(render(data))
