"""CSV as a stream of text chunks, for downloads and exports of any size."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator

_FLUSH_AT = 1 << 16


def stream_csv(header: list[str], rows: Iterable) -> Iterator[str]:
    """The header, then the rows, in chunks of about 64 KiB."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for row in rows:
        writer.writerow(row)
        if buf.tell() > _FLUSH_AT:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()
