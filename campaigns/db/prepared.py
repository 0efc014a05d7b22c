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
its plan (portal/settings.py; 0 turns preparing off for a pooler that cannot
keep prepared statements). A statement whose parameters grow with its input
stays on Django's own cursor: the server takes at most 65,535 parameters.

On SQLite this is Django's cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection
from django.db.backends.utils import CursorWrapper


@contextmanager
def cursor() -> Iterator[CursorWrapper]:
    if connection.vendor != "postgresql":
        with connection.cursor() as plain:
            yield plain
        return
    from django.db.backends.postgresql.base import (  # type: ignore[attr-defined]
        ServerBindingCursor,
    )

    # What connection.cursor() does (BaseDatabaseWrapper._cursor), with the
    # server-binding cursor class Django uses under OPTIONS server_side_binding:
    # the queries log, execute_wrapper and the error wrapping all apply.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        wrapped = connection._prepare_cursor(  # type: ignore[attr-defined]
            ServerBindingCursor(connection.connection)
        )
    with wrapped as bound:
        yield bound
