"""Log lines that say which campaign, batch and unit they are about.

A worker binds the ids once (`with bound(campaign=…, batch=…):`) and every
line logged inside, by our code or a library's, carries them as fields; in
production the lines are JSON (LOG_FORMAT=json), one object per line, so a
log store can filter by batch. Ids only: names, e-mail addresses and paths a
customer chose stay out of the logs.
"""

from __future__ import annotations

import contextlib
import logging
from contextvars import ContextVar

FIELDS = ("campaign", "batch", "unit", "order")
_bound: ContextVar[dict | None] = ContextVar("log_ids", default=None)


@contextlib.contextmanager
def bound(**ids):
    token = _bound.set({**(_bound.get() or {}), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _bound.reset(token)


class ContextFilter(logging.Filter):
    """Adds the bound ids to every record; `extra={"unit": …}` on a call wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = _bound.get() or {}
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, ids.get(name, ""))
        present = " ".join(f"{n}={getattr(record, n)}" for n in FIELDS if getattr(record, n) != "")
        record.ids = f" [{present}]" if present else ""
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s%(ids)s"
# The fields a JSON line carries (python-json-logger reads the names from here).
JSON_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s %(message)s "
    "%(campaign)s %(batch)s %(unit)s %(order)s %(process)d"
)


def logging_config(*, fmt: str, level: str) -> dict:
    formatter = (
        {"()": "pythonjsonlogger.json.JsonFormatter", "format": JSON_FORMAT}
        if fmt == "json"
        else {"format": TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"ids": {"()": "portal.log_context.ContextFilter"}},
        "formatters": {"main": formatter},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "main", "filters": ["ids"]}
        },
        "root": {"handlers": ["console"], "level": level},
    }
