from __future__ import annotations

from portal import checks


def test_server_database_with_embedded_broker_is_flagged():
    pg = "django.db.backends.postgresql"
    flagged = checks.broker_database_mismatch(engine=pg, broker_url="filesystem://")
    assert [w.id for w in flagged] == ["portal.W001"]
    assert checks.broker_database_mismatch(engine=pg, broker_url="redis://127.0.0.1:6379/0") == []
    sqlite = "django.db.backends.sqlite3"
    assert checks.broker_database_mismatch(engine=sqlite, broker_url="filesystem://") == []


def test_the_development_secret_key_is_refused_without_debug(settings):
    settings.DEBUG = False
    settings.SECRET_KEY = settings.INSECURE_DEV_SECRET_KEY
    assert [e.id for e in checks.check_secret_key(None)] == ["portal.E001"]
    settings.SECRET_KEY = "x" * 50
    assert checks.check_secret_key(None) == []
