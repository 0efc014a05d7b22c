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


@register("broker")
def check_broker_holds_a_batch(app_configs, **kwargs):
    return broker_batch_time_errors(
        broker_url=settings.CELERY_BROKER_URL,
        transport_options=getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}),
        batch_time_limit=settings.BATCH_TIME_LIMIT,
        rabbitmq_consumer_timeout_ms=settings.RABBITMQ_CONSUMER_TIMEOUT_MS,
    )


def broker_batch_time_errors(
    *,
    broker_url: str,
    transport_options: dict,
    batch_time_limit: int,
    rabbitmq_consumer_timeout_ms: int,
) -> list[Error]:
    """A broker that gives up on a message before the longest batch ends would
    deliver a healthy batch twice (Redis) or close the worker's channel (RabbitMQ)."""
    if broker_url.startswith(("redis://", "rediss://")):
        visibility = transport_options.get("visibility_timeout", 3600)
        if visibility <= batch_time_limit:
            return [
                Error(
                    f"Redis visibility_timeout {visibility} s does not outlast "
                    f"BATCH_TIME_LIMIT {batch_time_limit} s: a running batch would be "
                    "delivered again to another worker.",
                    hint="Leave CELERY_BROKER_TRANSPORT_OPTIONS to the settings (twice the "
                    "limit) or lower BATCH_TIME_LIMIT.",
                    id="portal.E002",
                )
            ]
    rabbit = broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))
    if rabbit and rabbitmq_consumer_timeout_ms <= batch_time_limit * 1000:
        return [
            Error(
                f"RabbitMQ consumer_timeout {rabbitmq_consumer_timeout_ms} ms does not "
                f"outlast BATCH_TIME_LIMIT {batch_time_limit} s: RabbitMQ would close the "
                "channel of a worker on a long batch.",
                hint="Raise consumer_timeout in rabbitmq.conf and set "
                "RABBITMQ_CONSUMER_TIMEOUT_MS to it (docs/deployment.md).",
                id="portal.E003",
            )
        ]
    return []
