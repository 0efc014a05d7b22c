"""System checks that say when the configuration is inconsistent."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register(Tags.security, deploy=False)
def check_secret_key(app_configs, **kwargs):
    if not settings.DEBUG and settings.SECRET_KEY == settings.INSECURE_DEV_SECRET_KEY:
        return [
            Error(
                "SECRET_KEY is the development fallback while DEBUG is off.",
                hint="Set SECRET_KEY in the environment.",
                id="portal.E001",
            )
        ]
    return []


@register()
def check_broker_matches_database(app_configs, **kwargs):
    return broker_database_mismatch(
        engine=settings.DATABASES["default"]["ENGINE"], broker_url=settings.CELERY_BROKER_URL
    )


def broker_database_mismatch(*, engine: str, broker_url: str) -> list[Warning]:
    if engine != "django.db.backends.sqlite3" and broker_url.startswith("filesystem://"):
        return [
            Warning(
                "A server database with the embedded filesystem broker: workers on other "
                "machines will never see the queued batches.",
                hint="Set CELERY_BROKER_URL to Redis or RabbitMQ (docs/deployment.md).",
                id="portal.W001",
            )
        ]
    return []
