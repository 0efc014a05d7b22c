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
import re
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

FIELDS = ("campaign", "batch", "unit", "order")
_bound: ContextVar[dict[str, object] | None] = ContextVar("log_ids", default=None)


@contextlib.contextmanager
def bound(**ids: object) -> Iterator[None]:
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


# A tracking link's token is the only key to an order: whoever reads it can
# follow the order and download the dossier (names, e-mail). The token chars are
# URL-safe base64; anything up to the next separator is taken, guessed tokens too.
_TRACKING_PATH = re.compile(r"(/order/t/)[^/\s?#'\"<>]+")
REDACTED = r"\1<redacted>"


def redact(text: str) -> str:
    return _TRACKING_PATH.sub(REDACTED, text) if "/order/t/" in text else text


class RedactTrackingTokens(logging.Filter):
    """Replaces `/order/t/<token>` by `/order/t/<redacted>` in a record's message,
    arguments and traceback text.

    Django writes the path of every 4xx/5xx response (django.request: "Not
    Found: /order/t/…/", django.security.csrf: "Forbidden (…): …", and the
    runserver line on django.server); the record itself is changed, so every
    handler after this filter writes the redacted text.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, dict):
            record.args = {k: _redact_arg(v) for k, v in record.args.items()}
        elif isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(a) for a in record.args)
        if record.exc_info and not record.exc_text:
            # An exception's message may quote the path; formatted once here,
            # and dropped from exc_info only when it had something to hide,
            # so formatters use the redacted text.
            text = logging.Formatter().formatException(record.exc_info)
            if redact(text) != text:
                record.exc_text, record.exc_info = redact(text), None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def _redact_arg(value: object) -> object:
    return redact(value) if isinstance(value, str) else value


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s%(ids)s"
# The fields a JSON line carries (python-json-logger reads the names from here).
JSON_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s %(message)s "
    "%(campaign)s %(batch)s %(unit)s %(order)s %(process)d"
)


def logging_config(*, fmt: str, level: str) -> dict[str, Any]:
    formatter = (
        {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": JSON_FORMAT,
            # Django attaches the request to its records; its repr carries the
            # path (a tracking token), and the message already names the path.
            "reserved_attrs": [*_JSON_RESERVED, "request"],
        }
        if fmt == "json"
        else {"format": TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "ids": {"()": "common.log_context.ContextFilter"},
            "redact": {"()": "common.log_context.RedactTrackingTokens"},
        },
        "formatters": {
            "main": formatter,
            "server": {
                "()": "django.utils.log.ServerFormatter",
                "format": "[{server_time}] {message}",
                "style": "{",
            },
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "main",
                "filters": ["redact", "ids"],
            },
            # runserver's request lines, as Django writes them, redacted.
            "server": {
                "class": "logging.StreamHandler",
                "formatter": "server",
                "filters": ["redact"],
            },
        },
        "loggers": {
            # Django's own defaults give `django` a console handler (DEBUG) and
            # mail_admins (no ADMINS here, so it sends nothing) that would write
            # before any filter of ours ran: its records go to the root handler.
            "django": {"handlers": [], "level": "INFO", "propagate": True},
            "django.server": {"handlers": ["server"], "level": "INFO", "propagate": False},
        },
        "root": {"handlers": ["console"], "level": level},
    }


def _json_reserved() -> list[str]:
    from pythonjsonlogger.core import RESERVED_ATTRS

    return list(RESERVED_ATTRS)


_JSON_RESERVED = _json_reserved()
