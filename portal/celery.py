from __future__ import annotations

import logging
import os
from pathlib import Path

from celery import Celery, signals

from portal import broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

logger = logging.getLogger(__name__)

# `filesystem://` is portal.broker's transport in every process that loads the
# app (web, worker, beat, management commands): kombu's own loses messages and
# stops the worker on a half-written file.
broker.register()

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")

# The filesystem transport expects its folders to exist.
for folder in (app.conf.broker_transport_options or {}).values():
    if isinstance(folder, str) and folder.startswith("/"):
        Path(folder).mkdir(parents=True, exist_ok=True)


@signals.task_prerun.connect
def _old_connections_closed(sender=None, **_) -> None:
    """Before each task a worker runs, as before each web request: a connection
    past CONN_MAX_AGE, or one that failed, is closed (CELERY_DB_REUSE_MAX keeps
    Celery from closing every one). Not for a task run in the caller's own
    process (eagerly): its connection, and any transaction on it, are the caller's."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


@signals.celeryd_init.connect
def _refuse_a_broker_that_cannot_hold_a_batch(**kwargs) -> None:
    """A worker does not start against a broker that would drop or redeliver a
    running batch (system checks portal.E002 / portal.E003)."""
    import django
    from django.core.checks import run_checks

    django.setup()
    from django.conf import settings

    from portal import checks

    found = list(run_checks(tags=["broker"]))
    if settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        # Asked of the server itself, at worker start only: `manage.py check`
        # stays offline.
        found += checks.redis_broker_problems(
            checks.redis_broker_config(settings.CELERY_BROKER_URL)
        )
    for warning in (m for m in found if not m.is_serious()):
        logger.warning("%s: %s %s", warning.id, warning.msg, warning.hint)
    errors = [e for e in found if e.is_serious()]
    if errors:
        # SystemExit: Celery logs and ignores an ordinary exception from a signal.
        raise SystemExit(
            "refusing to start: " + "; ".join(f"{e.id}: {e.msg} {e.hint}" for e in errors)
        )
