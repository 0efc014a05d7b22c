"""Notifications: an event recorded once (Notification's unique key), then
delivered by e-mail to the project's members and by a signed webhook, as the
project's alerts ask (ProjectAlerts; a project without a row gets every event
by e-mail and no webhook).

The webhook is a POST of a JSON body with these headers:
  X-BriefGPU-Event: the event ("checkpoint", "stall", ...)
  X-BriefGPU-Delivery: the notification's id (the same on every retry)
  X-BriefGPU-Timestamp: seconds since the epoch when it was signed
  X-BriefGPU-Signature: "sha256=" + HMAC-SHA256(secret, timestamp + "." + body), hex
A receiver recomputes the signature over the raw body with the project's
secret and compares in constant time (docs/method.md shows one). Deliveries
that fail are tried again at the next sweeps, WEBHOOK_TRIES times in all.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import socket
import ssl
import time
import urllib.parse

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from campaigns.models import Campaign, Notification, ProjectAlerts

log = logging.getLogger(__name__)

Delivery = Notification.Delivery


def alerts_of(project_id: int) -> ProjectAlerts:
    """The project's alerts, or the defaults (not saved) when it set none."""
    found = ProjectAlerts.objects.filter(project_id=project_id).first()
    return found if found is not None else ProjectAlerts(project_id=project_id)


def notification_raise(
    *, campaign: Campaign, event: str, key: str, title: str, message: str, payload: dict
) -> Notification | None:
    """Record the event once; None when it was already recorded. The
    deliveries are made by deliver_pending (the same sweep, right after)."""
    alerts = alerts_of(campaign.project_id)
    wanted = alerts.wants(event)
    email = Delivery.PENDING if wanted and alerts.email else Delivery.OFF
    webhook = Delivery.PENDING if wanted and alerts.webhook_url else Delivery.OFF
    try:
        with transaction.atomic():
            notification, created = Notification.objects.get_or_create(
                campaign=campaign,
                key=f"{event}:{key}"[:200],
                defaults={
                    "event": event,
                    "title": title[:300],
                    "message": message,
                    "payload": payload,
                    "email": email,
                    "webhook": webhook,
                },
            )
    except IntegrityError:  # another sweep recorded it meanwhile
        return None
    if created:
        log.info("campaign %s: %s (%s)", campaign.name, title, event)
    return notification if created else None


def deliver_pending(*, limit: int = 50) -> int:
    """Send what is still to send; returns how many notifications were tried."""
    pending = Notification.objects.filter(
        Q(email=Delivery.PENDING) | Q(webhook=Delivery.PENDING)
    ).select_related("campaign", "campaign__project")[:limit]
    tried = 0
    for notification in pending:
        # Claimed by update: two sweeps at once send it once.
        if not Notification.objects.filter(pk=notification.pk, tries=notification.tries).update(
            tries=F("tries") + 1
        ):
            continue
        notification.tries += 1
        tried += 1
        deliver(notification)
    return tried


def deliver(notification: Notification) -> None:
    alerts = alerts_of(notification.campaign.project_id)
    errors = []
    now = timezone.now()
    changes: dict = {}
    give_up = notification.tries >= settings.WEBHOOK_TRIES
    if notification.email == Delivery.PENDING:
        try:
            sent = _send_email(notification)
            changes["email"] = Delivery.SENT if sent else Delivery.OFF
            changes["email_at"] = now
        except Exception as exc:  # SMTP down, refused: tried again
            errors.append(f"e-mail: {exc}")
            if give_up:
                changes["email"] = Delivery.FAILED
    if notification.webhook == Delivery.PENDING:
        if not alerts.webhook_url:
            changes["webhook"] = Delivery.OFF
        else:
            try:
                status = post_webhook(alerts=alerts, notification=notification)
                changes.update(webhook=Delivery.SENT, webhook_at=now, webhook_status=status)
            except Exception as exc:  # one bad URL must not hold up the others' deliveries
                if not isinstance(exc, WebhookError):
                    log.exception("notification %s: webhook", notification.pk)
                    exc = WebhookError("the POST could not be made")
                errors.append(f"webhook: {exc}")
                changes["webhook_status"] = exc.status
                if give_up or exc.final:
                    changes["webhook"] = Delivery.FAILED
    changes["error"] = "; ".join(errors)[:2000]
    Notification.objects.filter(pk=notification.pk).update(**changes)
    for name, value in changes.items():
        setattr(notification, name, value)


def _send_email(notification: Notification) -> bool:
    campaign = notification.campaign
    recipients = sorted(
        {
            address
            for address in campaign.project.members.filter(is_active=True).values_list(
                "email", flat=True
            )
            if address
        }
    )
    if not recipients:
        return False
    link = f"{settings.SITE_URL.rstrip('/')}/campaigns/{campaign.name}/"
    body = (
        f"{notification.title}\n\n{notification.message}\n\n"
        f"Campaign: {campaign.name} (project {campaign.project.name})\n{link}\n\n"
        "You receive this as a member of the project; its alerts page says which "
        f"events are sent: {settings.SITE_URL.rstrip('/')}/campaigns/projects/"
        f"{campaign.project_id}/alerts/\n"
    )
    send_mail(
        f"[{campaign.name}] {notification.title}",
        body,
        None,
        recipients,
        fail_silently=False,
    )
    return True


class WebhookError(Exception):
    def __init__(self, message: str, *, status: int | None = None, final: bool = False):
        super().__init__(message)
        self.status, self.final = status, final


def webhook_body(notification: Notification) -> bytes:
    campaign = notification.campaign
    return json.dumps(
        {
            "id": notification.pk,
            "event": notification.event,
            "key": notification.key,
            "title": notification.title,
            "message": notification.message,
            "campaign": campaign.name,
            "project": campaign.project.name,
            "url": f"{settings.SITE_URL.rstrip('/')}/campaigns/{campaign.name}/",
            "created_at": notification.created_at.isoformat(),
            "data": notification.payload,
        },
        sort_keys=True,
    ).encode()


def signature(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def url_problem(url: str) -> str | None:
    """Why the server must not call `url`, or None: http(s) only, and, unless
    WEBHOOK_ALLOW_PRIVATE, no address of its own or its network."""
    return _resolve(url)[1]


def _resolve(url: str) -> tuple[str | None, str | None]:
    """(the address to connect to, None) or (None, why not)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None, "the webhook URL's port is not a port number"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, "the webhook URL must be an http:// or https:// URL with a host"
    default = 443 if parts.scheme == "https" else 80
    try:
        infos = socket.getaddrinfo(parts.hostname, port or default, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None, "the webhook's host does not resolve"
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not settings.WEBHOOK_ALLOW_PRIVATE:
        for address in addresses:
            if not address.is_global:
                return None, (
                    f"the webhook's host resolves to {address}, a private, loopback or "
                    "link-local address (WEBHOOK_ALLOW_PRIVATE allows them)"
                )
    return str(addresses[0]), None


class _Pinned(http.client.HTTPConnection):
    """Connects to the address that was checked, not to whatever the host
    name resolves to a moment later (DNS rebinding); the Host header keeps
    the name."""

    def __init__(self, host: str, port: int | None, *, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedTLS(http.client.HTTPSConnection):
    """The same over TLS: the certificate is checked against the host name."""

    def __init__(self, host: str, port: int | None, *, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post_webhook(*, alerts: ProjectAlerts, notification: Notification) -> int:
    """POST the signed body; the HTTP status when 2xx, else WebhookError.
    Redirects are not followed: they could lead to an address refused here.
    A failure says what kind it was, not the network's own words (a member
    must not map the server's network from the panel)."""
    address, problem = _resolve(alerts.webhook_url)
    if problem or address is None:
        raise WebhookError(problem or "no address", final=True)
    body = webhook_body(notification)
    timestamp = str(int(time.time()))
    parts = urllib.parse.urlsplit(alerts.webhook_url)
    kind = _PinnedTLS if parts.scheme == "https" else _Pinned
    port = parts.port or (443 if parts.scheme == "https" else 80)
    connection = kind(parts.hostname or "", port, address=address, timeout=settings.WEBHOOK_TIMEOUT)
    # A path or query with characters HTTP does not carry as they are (é) is
    # sent percent-encoded, as a browser would.
    path = urllib.parse.quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~") + (
        f"?{urllib.parse.quote(parts.query, safe='=&%:@!$()*+,;/?-._~')}" if parts.query else ""
    )
    try:
        connection.request(
            "POST",
            path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "User-Agent": "BriefGPU-webhook/1",
                "X-BriefGPU-Event": notification.event,
                "X-BriefGPU-Delivery": str(notification.pk),
                "X-BriefGPU-Timestamp": timestamp,
                "X-BriefGPU-Signature": signature(alerts.webhook_secret, timestamp, body),
            },
        )
        status = connection.getresponse().status
    except TimeoutError:
        raise WebhookError("no answer within WEBHOOK_TIMEOUT") from None
    except ssl.SSLError:
        raise WebhookError("the TLS handshake failed (certificate?)") from None
    except (OSError, http.client.HTTPException, ValueError):
        raise WebhookError("could not connect, or the answer was not HTTP") from None
    finally:
        connection.close()
    if not 200 <= status < 300:
        raise WebhookError(f"HTTP {status}", status=status)
    return status
