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


@register(Tags.security, deploy=True)
def check_rate_limit_client_address(app_configs, **kwargs):
    return rate_limit_address_warnings(
        debug=settings.DEBUG, ip_meta_key=getattr(settings, "RATELIMIT_IP_META_KEY", None)
    )


def rate_limit_address_warnings(*, debug: bool, ip_meta_key) -> list[Warning]:
    """Behind the documented proxy REMOTE_ADDR is the proxy: one count for every customer."""
    if not debug and not ip_meta_key:
        return [
            Warning(
                "Rate limits count clients by REMOTE_ADDR: behind nginx or caddy every "
                "customer shares the proxy's address, and one busy client blocks all.",
                hint="Set RATELIMIT_IP_META_KEY=HTTP_X_REAL_IP or "
                "portal.client_ip.forwarded_for (docs/deployment.md); silence "
                "portal.W002 only if clients reach the server directly.",
                id="portal.W002",
            )
        ]
    return []


@register(Tags.security, deploy=True)
def check_email_backend(app_configs, **kwargs):
    return email_backend_warnings(debug=settings.DEBUG, backend=settings.EMAIL_BACKEND)


def email_backend_warnings(*, debug: bool, backend: str) -> list[Warning]:
    if not debug and backend.endswith(("console.EmailBackend", "filebased.EmailBackend")):
        return [
            Warning(
                "E-mails are printed, not sent: customers' names and addresses go to the "
                "process's output (and the logs), and no customer gets their order e-mails.",
                hint="Set EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend and "
                "EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, "
                "EMAIL_USE_TLS (docs/deployment.md).",
                id="portal.W003",
            )
        ]
    return []


@register()
def check_btcpay(app_configs, **kwargs):
    return btcpay_errors(
        url=settings.BTCPAY_URL,
        store_id=settings.BTCPAY_STORE_ID,
        api_key=settings.BTCPAY_API_KEY,
        webhook_secret=settings.BTCPAY_WEBHOOK_SECRET,
    )


def btcpay_errors(
    *, url: str, store_id: str, api_key: str, webhook_secret: str
) -> list[Error | Warning]:
    parts = {"BTCPAY_URL": url, "BTCPAY_STORE_ID": store_id, "BTCPAY_API_KEY": api_key}
    if not any(parts.values()):
        return []
    missing = [name for name, value in parts.items() if not value]
    if missing:
        return [
            Error(
                f"BTCPay is partly configured: {', '.join(missing)} not set. Every quote "
                "is refused until all three are set (or none, for the address pool).",
                hint="docs/btcpay.md, 'Quotes from BTCPay invoices'.",
                id="portal.E004",
            )
        ]
    problems: list[Error | Warning] = []
    if not url.startswith(("https://", "http://")):
        problems.append(
            Error(
                f"BTCPAY_URL {url!r} is not an http(s) URL.",
                hint="The server's base URL, e.g. https://btcpay.example.org",
                id="portal.E005",
            )
        )
    if not webhook_secret:
        problems.append(
            Warning(
                "BTCPay creates the invoices but BTCPAY_WEBHOOK_SECRET is empty: every "
                "webhook delivery is refused, so payments never move an order.",
                hint="Create the store's webhook and copy its secret (docs/btcpay.md).",
                id="portal.W004",
            )
        )
    return problems


def redis_broker_config(url: str) -> dict[str, str] | None:
    """The Redis server's eviction and persistence settings, or None when CONFIG
    is refused (managed Redis often disables it) or the server does not answer."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        config = client.config_get("maxmemory-policy")
        config.update(client.config_get("appendonly"))
    except redis.RedisError:
        return None
    finally:
        client.close()
    return {str(k): str(v) for k, v in config.items()}


def redis_broker_problems(config: dict[str, str] | None) -> list[Warning | Error]:
    """What a Redis broker's own settings would do to queued batches.

    Evicting keys under memory pressure drops messages at random: refused.
    Without the append-only file a restart loses what was queued; the lease
    sweeper sends those batches again (docs/operations.md), so it is a warning.
    """
    if config is None:
        return [
            Warning(
                "Could not read the Redis broker's maxmemory-policy and appendonly "
                "(CONFIG GET refused or no answer).",
                hint="Check by hand: maxmemory-policy noeviction, appendonly yes "
                "(docs/deployment.md).",
                id="portal.W005",
            )
        ]
    problems: list[Warning | Error] = []
    policy = config.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        problems.append(
            Error(
                f"Redis maxmemory-policy is {policy}: when Redis runs short of memory it "
                "would evict queued batch messages.",
                hint="Set maxmemory-policy noeviction in redis.conf (docs/deployment.md).",
                id="portal.E006",
            )
        )
    if config.get("appendonly", "yes") != "yes":
        problems.append(
            Warning(
                "Redis appendonly is off: a Redis restart loses the queued messages; the "
                "sweeper sends those batches again only after their lease time.",
                hint="Set appendonly yes in redis.conf (docs/deployment.md).",
                id="portal.W006",
            )
        )
    return problems


@register()
def check_watch_key(app_configs, **kwargs):
    return watch_key_problems(key=settings.BTC_XPUB, script=settings.BTC_XPUB_SCRIPT)


def watch_key_problems(*, key: str, script: str) -> list[Error | Warning]:
    """BTC_XPUB must be a watch-only account key: a private key, a typo or an
    unknown script type would refuse every BTC quote (docs/ordering.md)."""
    if not key:
        return []
    from portal.payment_addresses import KeyRefused, parse_watch_key

    try:
        parsed = parse_watch_key(key, script)
    except KeyRefused as exc:
        return [
            Error(
                f"BTC_XPUB {exc}. Every BTC quote is refused.",
                hint="Set the account's extended public key (xpub/ypub/zpub) from the "
                "wallet's details, and BTC_XPUB_SCRIPT empty or p2wpkh, p2sh-p2wpkh, p2pkh "
                "(docs/ordering.md, 'Payment addresses').",
                id="portal.E007",
            )
        ]
    if parsed.depth != 3:
        return [
            Warning(
                f"BTC_XPUB is a key at depth {parsed.depth}, not an account key (depth 3, "
                "such as m/84'/0'/0'): addresses are derived at <key>/0/<index>.",
                hint="Check that the staff queue's first address is the wallet's first "
                "receive address (docs/ordering.md).",
                id="portal.W007",
            )
        ]
    return []


# Not a deploy-only check: `migrate` and every management command say it.
@register()
def check_operator(app_configs, **kwargs):
    names = settings.OPERATOR_DEFAULTS
    return operator_placeholder_warnings(
        debug=settings.DEBUG,
        values={name: getattr(settings, name) for name in names},
        defaults=names,
    ) + operator_text_errors(
        paths={name: getattr(settings, name) for name in names if name.endswith("_FILE")}
    )


def operator_placeholder_warnings(
    *, debug: bool, values: dict[str, str], defaults: dict[str, str]
) -> list[Warning]:
    """Customers sending money read the operator's name, address, terms and refund
    policy on every page: in production they must be the operator's own."""
    left = [name for name, value in values.items() if value == defaults.get(name)]
    if debug or not left:
        return []
    return [
        Warning(
            f"Placeholder defaults still in use: {', '.join(left)}. Every page's footer and "
            "the contact, terms and refund pages show them to customers.",
            hint="Set them to the operator's own name, e-mail, postal address and "
            "policy texts (docs/deployment.md, 'The operator').",
            id="portal.W008",
        )
    ]


def operator_text_errors(*, paths: dict[str, str]) -> list[Error]:
    from portal.legal_views import read_blocks

    return [
        Error(
            f"{name}={path} cannot be read as UTF-8 text: its page shows only the "
            "operator's e-mail address.",
            hint="Point it at a readable plain-text file (docs/deployment.md, 'The operator').",
            id="portal.E008",
        )
        for name, path in paths.items()
        if read_blocks(path) is None
    ]
