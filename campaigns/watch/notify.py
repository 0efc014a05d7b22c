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
import ipaddress
import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

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
            except WebhookError as exc:
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
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "the webhook URL must be an http:// or https:// URL with a host"
    if settings.WEBHOOK_ALLOW_PRIVATE:
        return None
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return f"the webhook's host does not resolve: {exc}"
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if not address.is_global:
            return (
                f"the webhook's host resolves to {address}, a private, loopback or "
                "link-local address (WEBHOOK_ALLOW_PRIVATE allows them)"
            )
    return None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect could lead the server to an address url_problem refused.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def post_webhook(*, alerts: ProjectAlerts, notification: Notification) -> int:
    """POST the signed body; the HTTP status when 2xx, else WebhookError."""
    problem = url_problem(alerts.webhook_url)
    if problem:
        raise WebhookError(problem, final=True)
    body = webhook_body(notification)
    timestamp = str(int(time.time()))
    request = urllib.request.Request(
        alerts.webhook_url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "BriefGPU-webhook/1",
            "X-BriefGPU-Event": notification.event,
            "X-BriefGPU-Delivery": str(notification.pk),
            "X-BriefGPU-Timestamp": timestamp,
            "X-BriefGPU-Signature": signature(alerts.webhook_secret, timestamp, body),
        },
    )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=settings.WEBHOOK_TIMEOUT) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        raise WebhookError(f"HTTP {exc.code}", status=exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise WebhookError(str(getattr(exc, "reason", exc))) from None
    if not 200 <= status < 300:
        raise WebhookError(f"HTTP {status}", status=status)
    return status
