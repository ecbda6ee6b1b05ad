"""Plain-text tables for the CLI's list commands (``--json`` prints the
rows as they are instead): one header row, columns padded to their widest
value, no trailing blanks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# (header, how to get the cell's text from one row)
Column = tuple[str, Callable[[dict[str, Any]], Any]]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], empty: str) -> str:
    """``empty`` is printed instead when there are no rows."""
    if not rows:
        return empty
    lines = [tuple(h for h, _ in columns)] + [
        tuple(cell(get(r)) for _, get in columns) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)
