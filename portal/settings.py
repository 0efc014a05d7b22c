"""One settings module, configured from the environment.

With no variable set this is the embedded default: SQLite and a filesystem
Celery broker under var/, outputs under var/outputs/. Set DATABASE_URL,
CELERY_BROKER_URL and OUTPUT_ROOT for the distributed setup (docs/deployment.md).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import environ
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from common.log_context import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()


def _path(value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else BASE_DIR / path


VAR_DIR = _path(env.str("VAR_DIR", default="var"))

DEBUG = env.bool("DEBUG", default=True)
# The fallback key only serves the embedded development default; the
# portal.E001 check refuses it once DEBUG is off.
INSECURE_DEV_SECRET_KEY = "dev-only-insecure-key-change-me"
SECRET_KEY = env.str("SECRET_KEY", default=INSECURE_DEV_SECRET_KEY)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "django_ratelimit",
    "axes",
    "portal",
    "campaigns",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Turns a rate-limited request into RATELIMIT_VIEW's readable 429.
    "django_ratelimit.middleware.RatelimitMiddleware",
    # A database outage answers a readable 503, not a traceback.
    "portal.health.DatabaseUnavailableMiddleware",
    "csp.middleware.CSPMiddleware",
    # Answers a locked-out login (site or admin) with AXES_LOCKOUT_TEMPLATE; last, as axes asks.
    "axes.middleware.AxesMiddleware",
]

# django-axes first: it refuses a locked-out username and address before the
# password is even checked, then the ordinary model backend.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# Content Security Policy, in development too so a violation shows up before
# production: scripts and styles from our own origin only (htmx, its Django
# helper and review.js are static files; htmx is told not to inject styles or
# eval in base.html), images and audio from us or data: URIs (thumbnails, the
# review pane's players), no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "media-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

if not DEBUG:
    # Production: cookies over HTTPS only, HSTS, no sniffing, behind a proxy
    # that terminates TLS and sets X-Forwarded-Proto (docs/deployment.md).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_REFERRER_POLICY = "same-origin"
    X_FRAME_OPTIONS = "DENY"

ROOT_URLCONF = "portal.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # The operator's name and contact, for every page's footer.
                "portal.context_processors.operator",
            ],
        },
    },
]

WSGI_APPLICATION = "portal.wsgi.application"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # The web process and a worker write to the same file: WAL lets readers
    # go on during a write, IMMEDIATE takes the write lock at BEGIN so two
    # writers queue on busy_timeout instead of failing on lock upgrade.
    _db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # SQLite creates the file, not its folder.
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # A file (not :memory:) so worker processes started by tests see the data.
    _db["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
else:
    _db.setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
    _db["CONN_HEALTH_CHECKS"] = True

# PostgreSQL: the statements campaigns/db/prepared.py sends are prepared on a
# connection once it has sent them this many times, so PostgreSQL keeps
# their plans; 0: never (a transaction-mode pooler that does not keep
# prepared statements: PgBouncer before 1.22). The connection's own
# threshold stays Django's (none): psycopg neither counts nor prepares
# what Django's cursors send.
DATABASE_PREPARE_AFTER = max(0, env.int("DATABASE_PREPARE_AFTER", default=5))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "campaign_list"
LOGOUT_REDIRECT_URL = "login"

# Folders the setup page offers as inputs (and their sub-folders, two levels
# down). Nothing outside them can be chosen from the browser.
CORPUS_ROOTS = [
    _path(p)
    for p in env.list(
        "CORPUS_ROOTS",
        default=[str(VAR_DIR / "corpora"), str(BASE_DIR / "campaigns" / "demo_corpus")],
    )
]
MANIFEST_UPLOAD_MAX_BYTES = env.int("MANIFEST_UPLOAD_MAX_BYTES", default=50 * 1024 * 1024)

# Where outputs go: <OUTPUT_ROOT>/<campaign>/<version>/... (campaigns.storage.paths).
# In the distributed setup every node must see the same OUTPUT_ROOT.
OUTPUT_ROOT = _path(env.str("OUTPUT_ROOT", default=str(VAR_DIR / "outputs")))

# A running batch holds a lease that its worker's heartbeat renews every
# quarter of this; a worker that dies stops renewing, and the sweeper puts the
# batch back in the queue once the lease is over.
BATCH_LEASE_SECONDS = env.int("BATCH_LEASE_SECONDS", default=60)
# Each worker process renews its WorkerBeat row this often (gpuworker/beat.py);
# silent three times as long, the live workers panel and the stall rules
# count it gone.
WORKER_BEAT_SECONDS = env.float("WORKER_BEAT_SECONDS", default=15.0)
# A run is stalled when no batch finished for this many times the recent median
# batch time, and never before WATCH_STALL_MIN_SECONDS (a first batch loads its
# model); sooner when the heartbeats prove the cause (campaigns/watch/stall.py).
WATCH_STALL_FACTOR = env.float("WATCH_STALL_FACTOR", default=5.0)
WATCH_STALL_MIN_SECONDS = env.float("WATCH_STALL_MIN_SECONDS", default=300.0)
# How often beat's watch sweep looks for the events it notifies (checkpoint,
# stall, done, failures, rental ending: docs/method.md, "Watching a run").
WATCH_SECONDS = env.float("WATCH_SECONDS", default=60.0)
# The failures event waits for this many processed units of a version.
WATCH_FAILURE_MIN_UNITS = env.int("WATCH_FAILURE_MIN_UNITS", default=50)
# A webhook POST waits this long for an answer; a failed one is tried again on
# the next sweeps, WEBHOOK_TRIES times in all.
WEBHOOK_TIMEOUT = env.float("WEBHOOK_TIMEOUT", default=5.0)
WEBHOOK_TRIES = env.int("WEBHOOK_TRIES", default=5)
# Webhook URLs that resolve to loopback, private or link-local addresses are
# refused (a project member could otherwise make the server call its own
# network); a deployment whose receivers live there allows them here.
WEBHOOK_ALLOW_PRIVATE = env.bool("WEBHOOK_ALLOW_PRIVATE", default=False)
# A batch whose worker died this many times fails its units instead of
# being requeued again (a poison input that kills the process, say).
BATCH_MAX_DELIVERIES = env.int("BATCH_MAX_DELIVERIES", default=5)
# A running training renews its heartbeat this often; silent for three times
# this, it is sent again and resumes from its last checkpoint.
TRAINING_HEARTBEAT_SECONDS = env.float("TRAINING_HEARTBEAT_SECONDS", default=30.0)
# A running batch-size profile renews its heartbeat this often; silent for
# three times this, the sweeper fails it (its page keeps what was measured).
PROFILE_HEARTBEAT_SECONDS = env.float("PROFILE_HEARTBEAT_SECONDS", default=30.0)
# A batch still running after this many seconds fails its units as `timeout`.
BATCH_TIME_LIMIT = env.int("BATCH_TIME_LIMIT", default=3600)
# A worker hands a batch's writes and recording to a thread once its model has
# run, and starts the next batch meanwhile (gpuworker.runner.batch.run_batch):
# "auto" where the model runs on a CUDA device (on the CPU the thread competes
# with the model for the cores: bench/RESULTS.md, "Tried and reverted: a
# pipelined worker"), "1" always, "0" never.
BATCH_PIPELINE = env.str("BATCH_PIPELINE", default="auto").strip().lower()
# Worker processes that share one device (`celery worker -c N` on one GPU, or N
# workers with the same CUDA_VISIBLE_DEVICES): each takes 1/N of the GPU's
# memory (profiles measure against it, the allocator refuses past it), or 1/N
# of the cores for torch on a CPU node (gpuworker.memory.work_device).
WORKERS_PER_DEVICE = env.int("WORKERS_PER_DEVICE", default=1)
if WORKERS_PER_DEVICE < 1:
    raise ImproperlyConfigured("WORKERS_PER_DEVICE counts worker processes: 1 or more.")
# Decoded pixels an image-transform worker process holds at once, 4 bytes each:
# this many in images being decoded, transformed, encoded or checked (a larger
# one alone), and as many again kept between a batch's reading and its writing
# (gpuworker/processors/pixel_budget.py; docs/processors.md, "Memory").
IMAGE_PIXEL_BUDGET = env.int("IMAGE_PIXEL_BUDGET", default=16_000_000)
if IMAGE_PIXEL_BUDGET < 1:
    raise ImproperlyConfigured("IMAGE_PIXEL_BUDGET counts pixels: 1 or more.")

# --- Profiles and estimates ------------------------------------------------------
# On CPU a profile measures against this memory budget (process RSS), as it
# measures against device memory on CUDA; WORKERS_PER_DEVICE processes split it.
PROFILE_CPU_MEMORY_BUDGET_MB = env.int("PROFILE_CPU_MEMORY_BUDGET_MB", default=8192)
# Speed relative to an A40 of a measuring device missing from the catalog, used
# to project its measured hours onto the catalog's cards. Unset: 0.03 for a CPU,
# 1.0 for an unlisted GPU (portal/advice.py; the estimate says which it took).
PROFILE_DEVICE_RELATIVE_THROUGHPUT = env.float("PROFILE_DEVICE_RELATIVE_THROUGHPUT", default=None)
# Hours of an estimate × this = the rental's working time (corrections, review).
PROFILE_SAFETY_FACTOR = env.float("PROFILE_SAFETY_FACTOR", default=1.5)

# --- Review and checkpoints -----------------------------------------------------
# Units in a checkpoint's spot-check sample.
CHECKPOINT_SAMPLE_SIZE = env.int("CHECKPOINT_SAMPLE_SIZE", default=20)
# One flag reason on more than this share of the sample fails the checkpoint.
CHECKPOINT_DEFECT_SHARE = env.float("CHECKPOINT_DEFECT_SHARE", default=0.2)
# Correction effort (campaigns/review/effort.py): a review decision that took
# longer than this from the item shown is idle time, left out of the review
# time; a gap this long between batches is left out of the production time.
REVIEW_IDLE_SECONDS = env.int("REVIEW_IDLE_SECONDS", default=300)
if REVIEW_IDLE_SECONDS < 1:
    raise ImproperlyConfigured("REVIEW_IDLE_SECONDS is a number of seconds: 1 or more.")

# --- The operator: who sells the rentals (docs/deployment.md, "The operator") ---
# Shown in every page's footer, on /contact/, /terms/ and /refunds/, and in the
# e-mails. The defaults are placeholders for development and the demo: check
# portal.W008 warns in production until each one is set.
OPERATOR_DEFAULTS = {
    "OPERATOR_NAME": "BriefGPU demo operator",
    "OPERATOR_EMAIL": "support@briefgpu.local",
    # One line: the postal address where the operator is established (legal notice).
    "OPERATOR_ADDRESS": "1 Example Street, 00000 Example City (placeholder address)",
    # Plain-text files, paragraphs separated by blank lines, a line starting
    # "# " a heading; the defaults are generic texts shipped in portal/legal/.
    "OPERATOR_TERMS_FILE": str(BASE_DIR / "portal" / "legal" / "terms.txt"),
    "OPERATOR_REFUNDS_FILE": str(BASE_DIR / "portal" / "legal" / "refunds.txt"),
}
OPERATOR_NAME = env.str("OPERATOR_NAME", default=OPERATOR_DEFAULTS["OPERATOR_NAME"])
OPERATOR_EMAIL = env.str("OPERATOR_EMAIL", default=OPERATOR_DEFAULTS["OPERATOR_EMAIL"])
OPERATOR_ADDRESS = env.str("OPERATOR_ADDRESS", default=OPERATOR_DEFAULTS["OPERATOR_ADDRESS"])
# Optional: company registration, VAT number; empty, not shown.
OPERATOR_REGISTRATION = env.str("OPERATOR_REGISTRATION", default="")
OPERATOR_TERMS_FILE = str(
    _path(env.str("OPERATOR_TERMS_FILE", default=OPERATOR_DEFAULTS["OPERATOR_TERMS_FILE"]))
)
OPERATOR_REFUNDS_FILE = str(
    _path(env.str("OPERATOR_REFUNDS_FILE", default=OPERATOR_DEFAULTS["OPERATOR_REFUNDS_FILE"]))
)

# --- Ordering portal ----------------------------------------------------------
FIAT_CURRENCY = env.str("FIAT_CURRENCY", default="EUR")
# A quote holds its crypto amount, and its cards, this long; unpaid, the order expires.
ORDER_QUOTE_MINUTES = env.int("ORDER_QUOTE_MINUTES", default=60)
# After "I paid" the cards stay held this long; with no payment seen by then the
# sweep releases them and the order waits for staff (docs/ordering.md, "Holds").
ORDER_NOTICE_HOLD_MINUTES = env.int("ORDER_NOTICE_HOLD_MINUTES", default=120)
# After a partial payment the cards stay held this long for the difference to
# arrive; a top-up after it goes ahead only if they are still free.
ORDER_UNDERPAID_HOLD_HOURS = env.int("ORDER_UNDERPAID_HOLD_HOURS", default=48)
# Open orders not fully paid (those holding cards for a window) one e-mail
# address, and one client address, may have at once.
ORDER_OPEN_PER_EMAIL = env.int("ORDER_OPEN_PER_EMAIL", default=2)
ORDER_OPEN_PER_CLIENT = env.int("ORDER_OPEN_PER_CLIENT", default=3)
# The share of a model's stock those unpaid orders may hold, per e-mail address
# and per client (rounded down, at least one card): one order for every card
# of a model would otherwise hold them all until its hold ends. 1 turns it off.
ORDER_MAX_HELD_SHARE = env.float("ORDER_MAX_HELD_SHARE", default=0.5)
if not 0 < ORDER_MAX_HELD_SHARE <= 1:
    raise ImproperlyConfigured("ORDER_MAX_HELD_SHARE is a share of the stock: above 0, at most 1.")
for _name in (
    "ORDER_NOTICE_HOLD_MINUTES",
    "ORDER_UNDERPAID_HOLD_HOURS",
    "ORDER_OPEN_PER_EMAIL",
    "ORDER_OPEN_PER_CLIENT",
):
    if globals()[_name] < 1:
        raise ImproperlyConfigured(f"{_name} must be 1 or more.")
# Staff enter rates in the admin; an older newest rate refuses new quotes.
EXCHANGE_RATE_MAX_AGE_MINUTES = env.int("EXCHANGE_RATE_MAX_AGE_MINUTES", default=30)
# The customer is reminded this long before the rental ends to retrieve results.
ORDER_END_REMINDER_HOURS = env.int("ORDER_END_REMINDER_HOURS", default=24)
# Shared secret of the BTCPay Server store's webhook; empty refuses every delivery.
BTCPAY_WEBHOOK_SECRET = env.str("BTCPAY_WEBHOOK_SECRET", default="")
# With these three set, every quote is a BTCPay invoice: its address and amount
# replace the pool and the staff rates (docs/btcpay.md). All empty: the pool.
# Check portal.E004 refuses a partial set.
BTCPAY_URL = env.str("BTCPAY_URL", default="").rstrip("/")
BTCPAY_STORE_ID = env.str("BTCPAY_STORE_ID", default="")
BTCPAY_API_KEY = env.str("BTCPAY_API_KEY", default="")
# A quote waits this long for BTCPay, then is refused: the customer is waiting.
BTCPAY_TIMEOUT_SECONDS = env.float("BTCPAY_TIMEOUT_SECONDS", default=10.0)
# Without BTCPay, each BTC quote gets the next receive address derived from this
# watch-only extended public key of the merchant's wallet account (xpub, ypub or
# zpub; tpub, upub or vpub on testnet), never a private key: check portal.E007
# refuses one (docs/ordering.md, "Payment addresses"). Empty: the address pool.
BTC_XPUB = env.str("BTC_XPUB", default="").strip()
# The script type of the derived addresses: p2wpkh (bc1q…), p2sh-p2wpkh (3…) or
# p2pkh (1…). Empty: the key's prefix says (zpub, ypub, xpub).
BTC_XPUB_SCRIPT = env.str("BTC_XPUB_SCRIPT", default="").strip().lower()
# The first receive index the portal gives out: above the addresses the wallet
# already handed out elsewhere, when the account is not the portal's alone.
BTC_XPUB_FIRST_INDEX = env.int("BTC_XPUB_FIRST_INDEX", default=0)
if not 0 <= BTC_XPUB_FIRST_INDEX < 2**31:
    raise ImproperlyConfigured("BTC_XPUB_FIRST_INDEX is a receive index: 0 to 2147483647.")
# The staff queue warns when this many derived addresses in a row are unpaid:
# a wallet with a smaller gap limit would not see a payment after them.
WALLET_GAP_LIMIT = env.int("WALLET_GAP_LIMIT", default=20)
# The pool's low-water mark: fewer free addresses of a currency than this and
# the staff queue shows a warning, the log says so, and STAFF_ALERT_EMAILS get
# one e-mail as the pool falls below it and one when it is empty.
PAYMENT_ADDRESS_LOW_WATER = env.int("PAYMENT_ADDRESS_LOW_WATER", default=10)
STAFF_ALERT_EMAILS = env.list("STAFF_ALERT_EMAILS", default=[])
# Per client address (django-ratelimit rates: count/period).
ORDER_CREATE_RATE = env.str("ORDER_CREATE_RATE", default="10/h")
ORDER_NOTICE_RATE = env.str("ORDER_NOTICE_RATE", default="20/h")
ORDER_DOSSIER_RATE = env.str("ORDER_DOSSIER_RATE", default="30/h")
# The lost-link page: submissions per client address, e-mails per e-mail address.
ORDER_RECOVER_RATE = env.str("ORDER_RECOVER_RATE", default="10/h")
ORDER_RECOVER_EMAIL_RATE = env.str("ORDER_RECOVER_EMAIL_RATE", default="3/d")
# "I paid" notices of one order answered by e-mail; later ones are recorded, not mailed.
ORDER_NOTICE_EMAILS_MAX = env.int("ORDER_NOTICE_EMAILS_MAX", default=3)


def _ip_meta_key(value: str) -> str | None:
    """Where django-ratelimit reads a client's address: REMOTE_ADDR when unset,
    a request header (HTTP_X_REAL_IP) or a function's dotted path."""
    if not value:
        return None
    if value == "REMOTE_ADDR" or value.startswith("HTTP_") or "." in value:
        return value
    raise ImproperlyConfigured(
        f"RATELIMIT_IP_META_KEY={value!r}: give a request.META key (HTTP_X_REAL_IP) "
        "or a function's dotted path (portal.client_ip.forwarded_for)."
    )


# The client address rate limits count by. Unset, REMOTE_ADDR: right for
# runserver and for a server that faces clients itself. Behind nginx or caddy
# REMOTE_ADDR is the proxy and every customer would share one count: set
# HTTP_X_REAL_IP, or portal.client_ip.forwarded_for with the number of proxies
# that append to X-Forwarded-For (docs/deployment.md, check portal.W002).
RATELIMIT_IP_META_KEY = _ip_meta_key(env.str("RATELIMIT_IP_META_KEY", default=""))
RATELIMIT_TRUSTED_PROXIES = env.int("RATELIMIT_TRUSTED_PROXIES", default=1)
if RATELIMIT_TRUSTED_PROXIES < 1:
    raise ImproperlyConfigured("RATELIMIT_TRUSTED_PROXIES counts proxies: 1 or more.")

# --- Login throttling (django-axes), on the site's and the admin's login ------
# LOGIN_FAILURE_LIMIT wrong passwords for one username from one client address
# lock that pair out for LOGIN_COOLOFF_MINUTES (the right password included),
# and LOGIN_ADDRESS_FAILURE_LIMIT wrong passwords from one client address,
# whatever the usernames, lock the address (portal/login_throttle.py). Failures
# are kept in the database (AccessAttempt); `manage.py axes_reset` lifts every
# lockout.
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
LOGIN_ADDRESS_FAILURE_LIMIT = env.int("LOGIN_ADDRESS_FAILURE_LIMIT", default=20)
LOGIN_COOLOFF_MINUTES = env.int("LOGIN_COOLOFF_MINUTES", default=30)
AXES_COOLOFF_TIME = timedelta(minutes=LOGIN_COOLOFF_MINUTES)
AXES_HANDLER = "portal.login_throttle.LoginThrottleHandler"
# What the handler reads; listed for axes' own tools and log lines.
AXES_LOCKOUT_PARAMETERS = ["ip_address", ["username", "ip_address"]]
# A successful login clears its username's failures at that address only
# (LoginThrottleHandler.reset_user_attempts).
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# The same client as the rate limits (RATELIMIT_IP_META_KEY above), an IPv6
# client by its /64.
AXES_CLIENT_IP_CALLABLE = "portal.client_ip.client_network"
# Log lines name the path of a failure, the username and address masked
# (AXES_SENSITIVE_PARAMETERS), not the user agent, and no start-up banner in
# every process's log.
AXES_VERBOSE = False
if AXES_FAILURE_LIMIT < 1 or LOGIN_COOLOFF_MINUTES < 1:
    raise ImproperlyConfigured("LOGIN_FAILURE_LIMIT and LOGIN_COOLOFF_MINUTES: 1 or more.")
if LOGIN_ADDRESS_FAILURE_LIMIT < AXES_FAILURE_LIMIT:
    raise ImproperlyConfigured(
        "LOGIN_ADDRESS_FAILURE_LIMIT counts every username of an address: at least "
        "LOGIN_FAILURE_LIMIT."
    )

# Order dossiers are kept here, regenerated when the order changes.
DOSSIER_ROOT = _path(env.str("DOSSIER_ROOT", default=str(VAR_DIR / "dossiers")))

# The console backend (the default) prints every e-mail, customer name and
# address included, to the web process's output: development only. Production
# sets the SMTP backend and the EMAIL_* below (docs/deployment.md, check portal.W003).
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured(
        "EMAIL_USE_TLS (STARTTLS, port 587) and EMAIL_USE_SSL (port 465): set one."
    )
# Links in e-mails point here.
SITE_URL = env.str("SITE_URL", default="http://127.0.0.1:8000")
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="BriefGPU <orders@briefgpu.local>")
# Rate limits count in this cache. The default lives in one process (the
# embedded runserver); with several web processes set CACHE_URL to Redis.
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://")}
RATELIMIT_VIEW = "portal.order_views.rate_limited"
# Checks silenced on purpose, comma-separated: e.g. a production server that
# runs one single web process may silence django_ratelimit.E003 below.
SILENCED_SYSTEM_CHECKS = env.list("SILENCED_SYSTEM_CHECKS", default=[])
if DEBUG and CACHES["default"]["BACKEND"].endswith("LocMemCache"):
    # One process in development: its own cache is the shared one. In production
    # (gunicorn's several workers) django-ratelimit's E003 stays on: each worker
    # would count alone, multiplying every limit (docs/deployment.md).
    SILENCED_SYSTEM_CHECKS += ["django_ratelimit.E003", "django_ratelimit.W001"]

# --- Celery -----------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://localhost/")
CELERY_BROKER_DIR = VAR_DIR / "broker"
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport with whole-file writes and reads that
    # skip a file not yet decodable (portal/broker.py, registered by
    # portal/celery.py): a real broker that needs no server. kombu's own lost
    # 8-10 of 3,000 messages to JSONDecodeError, each one a worker would stop
    # on; kombu's SQLAlchemy transport on SQLite lost none but ran 10-20x
    # slower and polled at a quarter of a core while idle (bench/RESULTS.md,
    # "Embedded broker"). It deletes a message when a worker takes it, so late
    # acknowledgement cannot bring back a batch whose worker died; the
    # distributed setup can.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_BROKER_DIR / "queue"),
        "data_folder_out": str(CELERY_BROKER_DIR / "queue"),
        "control_folder": str(CELERY_BROKER_DIR / "control"),
        # Message files that stayed undecodable go here, with a log line.
        "bad_folder": str(CELERY_BROKER_DIR / "bad"),
        # A worker looks for its next batch this often (after each batch it
        # waits for the next look): a longer interval leaves the device idle
        # between batches, and polling this often costs a few percent of one
        # core while idle (bench/RESULTS.md, "Rows inserted as rows, fewer
        # statements a batch (2026-12-01)").
        "polling_interval": 0.01,
    }
CELERY_TASK_IGNORE_RESULT = True
# Celery's Django fixup closes every database connection before and after each
# task unless this is set: on PostgreSQL a new session a batch (a server process
# forked, authenticated, its time zone set; bench/RESULTS.md, "A record campaign
# at scale, end to end"). Set, the fixup closes them only after this many tasks,
# and portal/celery.py applies Django's own rules before each task instead, as
# before each web request: CONN_MAX_AGE, and CONN_HEALTH_CHECKS (a connection a
# database restart broke is replaced before the task uses it).
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ROUTES = {"gpuworker.tasks.*": {"queue": "gpu"}}
# Only worker processes import the task modules (and so torch).
CELERY_IMPORTS = ["gpuworker.tasks", "campaigns.tasks"]
# The rest of a large run a web request started (plan_campaign) and the
# sweeps: no torch, and never behind the batches. Beat runs the sweeps itself
# (BEAT_IN_PROCESS); one sent by hand or at a worker's start comes here.
CELERY_TASK_ROUTES["campaigns.tasks.*"] = {"queue": "portal"}
CELERY_IMPORTS.append("portal.tasks")
CELERY_IMPORTS.append("gpuworker.training_tasks")
CELERY_TASK_ROUTES["gpuworker.training_tasks.*"] = {"queue": "gpu"}
# The order sweeps (quote expiry, rental-end reminders) have their own queue:
# on `gpu` they would wait behind hour-long batches on workers that take one
# job at a time. A small `celery worker -Q portal` serves it (docs/deployment.md);
# the development worker (`make run`) consumes both.
CELERY_TASK_ROUTES["portal.tasks.*"] = {"queue": "portal"}
# Run with `celery worker -B` (embedded default) or a separate `celery beat`.
CELERY_BEAT_SCHEDULE = {
    "requeue-expired-leases": {
        "task": "campaigns.tasks.requeue_expired_batches",
        "schedule": max(1.0, BATCH_LEASE_SECONDS / 2),
    },
    "requeue-stale-trainings": {
        "task": "campaigns.tasks.requeue_stale_trainings",
        "schedule": max(1.0, TRAINING_HEARTBEAT_SECONDS),
    },
    "fail-stale-profiles": {
        "task": "campaigns.tasks.fail_stale_profiles",
        "schedule": max(1.0, PROFILE_HEARTBEAT_SECONDS),
    },
    "expire-unpaid-quotes": {"task": "portal.tasks.expire_unpaid_quotes", "schedule": 60.0},
    "rental-end-sweep": {"task": "portal.tasks.rental_end_sweep", "schedule": 300.0},
    "watch-runs": {"task": "campaigns.tasks.watch_runs", "schedule": max(1.0, WATCH_SECONDS)},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Beat calls these sweeps itself on its tick rather than sending them
# (portal/beat.py): a message would wait behind the queued work, and a batch
# whose worker died would stay "running" until the queue drained. They touch
# the database only.
CELERY_BEAT_SCHEDULER = "portal.beat:SweepScheduler"
BEAT_IN_PROCESS = frozenset(
    {
        "campaigns.tasks.requeue_expired_batches",
        "campaigns.tasks.requeue_stale_trainings",
        "campaigns.tasks.fail_stale_profiles",
        # A stall's notification must not wait behind the work that stalled.
        "campaigns.tasks.watch_runs",
    }
)
if CELERY_BROKER_URL.startswith("redis"):
    # Redis redelivers an unacknowledged message only after this; it must
    # outlast the longest batch or a healthy batch would run twice.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": BATCH_TIME_LIMIT * 2,
        # redis-py waits on a connect as long as the OS does (minutes) without it.
        "socket_connect_timeout": 3,
    }
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A broker that does not answer holds Run and Resume a few seconds, not a web
# server's timeout: three tries a second or so apart, each connection attempt
# cut at 3 s. campaigns/runs/start.py then says so and leaves the batches
# queued in the database for the lost-message sweep.
CELERY_BROKER_CONNECTION_TIMEOUT = 3.0
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 1,
}
# What the RabbitMQ server's consumer_timeout is set to (its default: 30 min);
# check portal.E003 refuses a batch time limit it cannot hold.
RABBITMQ_CONSUMER_TIMEOUT_MS = env.int("RABBITMQ_CONSUMER_TIMEOUT_MS", default=1_800_000)

# One line per event with the campaign, batch and unit ids as fields; JSON in
# production (common/log_context.py).
LOG_FORMAT = env.str("LOG_FORMAT", default="text" if DEBUG else "json")
LOGGING = logging_config(fmt=LOG_FORMAT, level=env.str("LOG_LEVEL", default="INFO"))
