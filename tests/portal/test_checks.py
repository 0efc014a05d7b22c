from __future__ import annotations

import os
import subprocess
import sys

from portal import checks
from tests.worker import REPO


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


def test_production_without_a_client_address_source_is_warned():
    assert [w.id for w in checks.rate_limit_address_warnings(debug=False, ip_meta_key=None)] == [
        "portal.W002"
    ]
    assert checks.rate_limit_address_warnings(debug=False, ip_meta_key="HTTP_X_REAL_IP") == []
    assert checks.rate_limit_address_warnings(debug=True, ip_meta_key=None) == []


def test_production_printing_e_mails_is_warned():
    console = "django.core.mail.backends.console.EmailBackend"
    assert [w.id for w in checks.email_backend_warnings(debug=False, backend=console)] == [
        "portal.W003"
    ]
    smtp = "django.core.mail.backends.smtp.EmailBackend"
    assert checks.email_backend_warnings(debug=False, backend=smtp) == []
    assert checks.email_backend_warnings(debug=True, backend=console) == []


def test_a_partial_or_unsigned_btcpay_configuration_is_flagged():
    full = {"url": "https://btcpay.example.org", "store_id": "s", "api_key": "k"}
    assert checks.btcpay_errors(url="", store_id="", api_key="", webhook_secret="") == []
    assert checks.btcpay_errors(**full, webhook_secret="secret") == []
    partial = checks.btcpay_errors(**{**full, "api_key": ""}, webhook_secret="secret")
    assert [e.id for e in partial] == ["portal.E004"] and "BTCPAY_API_KEY" in partial[0].msg
    assert [w.id for w in checks.btcpay_errors(**full, webhook_secret="")] == ["portal.W004"]
    bad_url = checks.btcpay_errors(**{**full, "url": "btcpay.example.org"}, webhook_secret="s")
    assert [e.id for e in bad_url] == ["portal.E005"]


def _settings_with(**env) -> subprocess.CompletedProcess:
    """The settings module loaded in a fresh process with `env`, as a deployment loads it."""
    code = (
        "from django.conf import settings as s\n"
        "print(s.RATELIMIT_IP_META_KEY, s.RATELIMIT_TRUSTED_PROXIES)"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_client_address_source_comes_from_the_environment():
    assert _settings_with().stdout.split() == ["None", "1"]
    real_ip = _settings_with(RATELIMIT_IP_META_KEY="HTTP_X_REAL_IP")
    assert real_ip.stdout.split() == ["HTTP_X_REAL_IP", "1"]
    forwarded = _settings_with(
        RATELIMIT_IP_META_KEY="portal.client_ip.forwarded_for", RATELIMIT_TRUSTED_PROXIES="2"
    )
    assert forwarded.stdout.split() == ["portal.client_ip.forwarded_for", "2"]


def test_settings_refuse_an_unusable_client_address_source():
    header_name = _settings_with(RATELIMIT_IP_META_KEY="X-Real-IP")
    assert header_name.returncode != 0
    assert "RATELIMIT_IP_META_KEY='X-Real-IP'" in header_name.stderr
    assert _settings_with(RATELIMIT_TRUSTED_PROXIES="0").returncode != 0


def test_settings_refuse_no_worker_process_per_device():
    refused = _settings_with(WORKERS_PER_DEVICE="0")
    assert refused.returncode != 0
    assert "WORKERS_PER_DEVICE counts worker processes: 1 or more." in refused.stderr
    assert _settings_with(WORKERS_PER_DEVICE="2").returncode == 0


def test_the_order_sweeps_have_their_own_queue_and_the_workers_consume_it():
    # Beat's order sweeps must not wait behind hour-long batches on the gpu queue.
    from django.conf import settings

    from portal.celery import app
    from tests.worker import QUEUES

    for entry in ("expire-unpaid-quotes", "rental-end-sweep"):
        task = settings.CELERY_BEAT_SCHEDULE[entry]["task"]
        assert app.amqp.router.route({}, task)["queue"].name == "portal"
    assert app.amqp.router.route({}, "gpuworker.tasks.run_batch")["queue"].name == "gpu"
    # The development worker (make run, make worker) and the test workers take both.
    makefile = (REPO / "Makefile").read_text()
    assert makefile.count("celery -A portal worker -Q gpu,portal") == 2
    assert set(QUEUES) == {"gpu", "portal"}


def test_a_redis_broker_that_evicts_is_an_error_and_one_without_persistence_a_warning():
    from portal.checks import redis_broker_problems

    assert redis_broker_problems({"maxmemory-policy": "noeviction", "appendonly": "yes"}) == []
    evicting = redis_broker_problems({"maxmemory-policy": "allkeys-lru", "appendonly": "yes"})
    assert [(m.id, m.is_serious()) for m in evicting] == [("portal.E006", True)]
    assert "allkeys-lru" in evicting[0].msg
    volatile = redis_broker_problems({"maxmemory-policy": "noeviction", "appendonly": "no"})
    assert [(m.id, m.is_serious()) for m in volatile] == [("portal.W006", False)]
    unknown = redis_broker_problems(None)
    assert [(m.id, m.is_serious()) for m in unknown] == [("portal.W005", False)]


def test_the_lease_sweeps_run_inside_beat_and_nothing_of_campaigns_waits_on_gpu():
    # A sweep sent to `gpu` waits behind every queued batch; beat calls them itself.
    from celery.beat import PersistentScheduler
    from django.conf import settings

    from portal.beat import SweepScheduler
    from portal.celery import app

    assert app.conf.beat_scheduler == "portal.beat:SweepScheduler"
    assert issubclass(SweepScheduler, PersistentScheduler)
    sweeps = {
        entry["task"]
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items()
        if name
        in (
            "requeue-expired-leases",
            "requeue-stale-trainings",
            "fail-stale-profiles",
            "watch-runs",
        )
    }
    assert sweeps == settings.BEAT_IN_PROCESS
    for task in sweeps | {"campaigns.tasks.plan_campaign"}:
        assert app.amqp.router.route({}, task)["queue"].name == "portal"
