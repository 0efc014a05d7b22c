"""Health and the database-down answer: what a load balancer and a person see."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.shortcuts import render

log = logging.getLogger(__name__)


def _database_ok() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True, "ok"
    except DatabaseError as exc:
        return False, type(exc).__name__


def _broker_ok() -> tuple[bool, str]:
    from portal.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return True, "ok"
    except Exception as exc:  # noqa: BLE001 — any failure to connect is "down"
        return False, type(exc).__name__


def health(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker answer, 503 with which one does not."""
    database, database_detail = _database_ok()
    broker, broker_detail = _broker_ok()
    status = 200 if database and broker else 503
    return JsonResponse(
        {"database": database_detail, "broker": broker_detail, "ok": status == 200},
        status=status,
    )


class DatabaseUnavailableMiddleware:
    """A database that is down (restarting, unreachable) answers 503 with a page
    that says so, never a traceback; the next request reconnects by itself."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, DatabaseError) or _database_ok()[0]:
            return None  # a bug in a query, not an outage: the usual 500
        # The view's name, not the path: a tracking link's path is its secret.
        view = request.resolver_match.view_name if request.resolver_match else "?"
        log.warning("database unavailable while serving %s", view)
        connection.close_if_unusable_or_obsolete()
        response = render(request, "503.html", status=503)
        response["Retry-After"] = "30"
        return response
