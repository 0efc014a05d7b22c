"""The health endpoint and the page a database outage shows."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import OperationalError
from django.db.backends.utils import CursorWrapper

from portal.celery import app as celery_app


def test_health_says_ok_when_database_and_broker_answer(client, db):
    response = client.get("/health/")
    assert response.status_code == 200
    assert response.json() == {"database": "ok", "broker": "ok", "ok": True}


def test_health_is_503_and_names_the_broker_when_it_is_down(client, db, monkeypatch):
    # Nothing listens on port 1: a real failed connection, not a mock. Celery
    # reads CELERY_BROKER_URL from the environment before its own settings.
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")
    assert celery_app.conf.broker_write_url == "redis://127.0.0.1:1/0"
    response = client.get("/health/")
    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "ok" and body["broker"] != "ok" and body["ok"] is False


@pytest.fixture
def database_down():
    """Every query fails as it does while PostgreSQL restarts (connection refused)."""
    refused = OperationalError("connection to server at 127.0.0.1 refused")
    with mock.patch.object(CursorWrapper, "execute", side_effect=refused):
        yield


def test_a_database_outage_is_a_readable_503_not_a_traceback(client, owner, database_down):
    response = client.get("/order/")
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    page = response.content.decode()
    assert "Temporarily unavailable" in page and "Traceback" not in page


def test_a_query_bug_with_the_database_up_is_not_hidden_as_an_outage(rf, db):
    from portal.health import DatabaseUnavailableMiddleware

    middleware = DatabaseUnavailableMiddleware(lambda request: None)
    bug = OperationalError("no such column: order.nonexistent")
    assert middleware.process_exception(rf.get("/order/"), bug) is None
