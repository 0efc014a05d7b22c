"""CSV as a stream of text chunks, for downloads and exports of any size.

Every text cell goes through `spreadsheet_safe`: ids, paths, categories and
messages come from the people who name the files, and a spreadsheet that opens
a CSV runs a cell starting with `=`, `+`, `-` or `@` as a formula (OWASP, "CSV
Injection"). docs/method.md says how to read such a cell back.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

_FLUSH_AT = 1 << 16

# OWASP's list (a tab and a carriage return start a formula in some
# spreadsheets too), and the quote itself: a cell that starts with one gets
# one more, so taking one leading quote off gives every value back exactly.
FORMULA_STARTS = frozenset("=+-@\t\r'")


def spreadsheet_safe(cell: Any) -> Any:
    """A text cell a spreadsheet would run as a formula, behind a single quote.

    Numbers stay numbers (a negative margin is no formula); only text comes
    from users."""
    if type(cell) is str and cell and cell[0] in FORMULA_STARTS:
        return "'" + cell
    return cell


def safe_row(row: Sequence[Any]) -> Sequence[Any]:
    """The row as it may be written: itself when no cell needs a quote, the
    usual case, which costs one look at each cell's first character."""
    for cell in row:
        if type(cell) is str and cell[:1] in FORMULA_STARTS:
            return [spreadsheet_safe(c) for c in row]
    return row


def stream_csv(header: list[str], rows: Iterable) -> Iterator[str]:
    """The header, then the rows, in chunks of about 64 KiB."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for row in rows:
        writer.writerow(safe_row(row))
        if buf.tell() > _FLUSH_AT:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()
