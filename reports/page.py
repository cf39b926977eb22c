"""The parts of the HTML pages the reports write (gallery, report, evaluation, training, text, forecast): a
self-contained page with its inline style sheet, a table whose numbers are right-aligned, and a JPEG as a
data: URI, so that a page needs no other file."""

from __future__ import annotations

import base64
import html
import re

PAGE_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.provenance, .note { color: #555; font-size: 0.9em; }
.warning { color: #a40; font-weight: bold; }
.cluster { display: flex; gap: 12px; align-items: flex-start; padding: 6px 0; border-top: 1px solid #eee; }
.cluster .label { flex: 0 0 190px; font-size: 0.9em; }
.cluster.empty .label { color: #999; }
.cluster .thumbs { flex: 1 1 auto; min-width: 0; }
/* one row of thumbnails per node at any page width: columns shrink below the thumbnails' size, never wrap */
.thumbs { display: grid; gap: 4px; }
figure { margin: 0; text-align: center; font-size: 0.75em; color: #666; }
figure img { display: block; image-rendering: auto; }
.thumbs figure { min-width: 0; } .thumbs figure img { max-width: 100%; height: auto; }
.thumbs figcaption { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
"""


def html_page(title: str, body: str) -> str:
    """A self-contained page: inline style, no script, no external reference."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{PAGE_STYLE}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def html_table(header: list[str], rows: list[list]) -> str:
    """Numbers (with a unit, possibly) are right-aligned, text left-aligned."""

    def cell(value) -> str:
        numeric = bool(re.fullmatch(r"[-\d.,x/%]+( \S+)?", str(value)))
        return f'<td class="{"num" if numeric else "text"}">{html.escape(str(value))}</td>'

    head = "".join(f"<th>{html.escape(str(name))}</th>" for name in header)
    body = "".join("<tr>" + "".join(cell(value) for value in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def jpeg_data_uri(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
