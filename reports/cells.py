"""How a value reads in a cell of the run report: numbers, and error messages cut short or folded."""

from __future__ import annotations

import html

from pipeline.progress import format_number

SHOWN_MESSAGE = 160  # characters of an error message shown before it is cut short (or folded)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 clip`, `2 clips`, `1,200 clips`; `plural` for a noun that does not take an s (leaf, leaves)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def number(value) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else format_number(value)


def shortened(message: str) -> str:
    return message if len(message) <= SHOWN_MESSAGE else message[: SHOWN_MESSAGE - 1].rstrip() + "…"


def folded(message: str) -> str:
    """A message as HTML: in full when short, else its beginning with the rest folded (a click opens it)."""
    if len(message) <= SHOWN_MESSAGE:
        return html.escape(message)
    return f"<details><summary>{html.escape(shortened(message))}</summary>{html.escape(message)}</details>"
