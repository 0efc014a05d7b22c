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


def test_a_broker_that_cannot_hold_the_longest_batch_is_refused():
    redis = "redis://127.0.0.1:6379/0"
    short = checks.broker_batch_time_errors(
        broker_url=redis,
        transport_options={"visibility_timeout": 600},
        batch_time_limit=3600,
        rabbitmq_consumer_timeout_ms=0,
    )
    assert [e.id for e in short] == ["portal.E002"] and "3600 s" in short[0].msg
    assert (
        checks.broker_batch_time_errors(
            broker_url=redis,
            transport_options={"visibility_timeout": 7200},
            batch_time_limit=3600,
            rabbitmq_consumer_timeout_ms=0,
        )
        == []
    )
    rabbit = checks.broker_batch_time_errors(
        broker_url="amqp://guest:guest@127.0.0.1:5672//",
        transport_options={},
        batch_time_limit=3600,
        rabbitmq_consumer_timeout_ms=1_800_000,  # RabbitMQ's default, 30 min
    )
    assert [e.id for e in rabbit] == ["portal.E003"]


def test_the_configured_broker_passes_its_own_check():
    assert checks.check_broker_holds_a_batch(None) == []
