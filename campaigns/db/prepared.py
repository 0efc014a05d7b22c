"""A cursor for the statements a page or a batch sends thousands of times.

Django's psycopg cursors bind parameters in Python, so that a statement of any
size goes (an `IN` list of a hundred thousand ids, a VALUES list of a chunk),
and PostgreSQL plans every statement anew. For the few statements of a fixed
shape that every page view and every batch sends (a value a placeholder, a
column's values as one array), planning took longer than running them: the
campaign page's header planned for ~0.7 ms and ran for 0.1 (bench/RESULTS.md,
"Statements bound and prepared by the server (2026-12-04)"). Through this
cursor the server binds their parameters, and once a connection has sent one
`DATABASE_PREPARE_AFTER` times psycopg prepares it there, so PostgreSQL keeps
its plan (0 turns preparing off, for a pooler that cannot keep prepared
statements). The connection counts statements only while this cursor is
open: what Django's cursors send is neither counted nor prepared. A
statement whose parameters grow with its input stays on Django's cursor: the
server takes at most 65,535 parameters.

A statement prepared before a migration changed a column it reads fails with
"cached plan must not change result type", and PostgreSQL answers so until
the prepared statement goes. Inside a transaction the rollback that follows
drops psycopg's prepared statements; outside one, this cursor closes the
connection, so the next request or batch opens a fresh one.

On SQLite this is Django's cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, NotSupportedError, connections
from django.db.backends.utils import CursorWrapper

#: PostgreSQL's words when a prepared statement's columns changed under it.
CHANGED_RESULT = "cached plan must not change result type"


@contextmanager
def cursor() -> Iterator[CursorWrapper]:
    # The connection looked up once: each read of `django.db.connection`
    # goes through a thread-local lookup, and a batch opens this cursor
    # about ten times.
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        with conn.cursor() as plain:
            yield plain
        return
    from django.db.backends.postgresql.base import (  # type: ignore[attr-defined]
        ServerBindingCursor,
    )

    # What connection.cursor() does (BaseDatabaseWrapper._cursor), with the
    # server-binding cursor class Django uses under OPTIONS server_side_binding:
    # the queries log, execute_wrapper and the error wrapping all apply.
    conn.close_if_health_check_failed()
    conn.ensure_connection()
    raw = conn.connection
    with conn.wrap_database_errors:
        wrapped = conn._prepare_cursor(  # type: ignore[attr-defined]
            ServerBindingCursor(raw)
        )
    raw.prepare_threshold = settings.DATABASE_PREPARE_AFTER or None
    try:
        with wrapped as bound:
            yield bound
    except NotSupportedError as exc:
        if CHANGED_RESULT in str(exc) and not conn.in_atomic_block:
            conn.close()
        raise
    finally:
        raw.prepare_threshold = None
