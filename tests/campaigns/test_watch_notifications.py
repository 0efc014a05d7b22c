"""The watch sweep's notifications: each event once, by e-mail to the
project's members (locmem backend) and by a webhook signed with the project's
secret, POSTed to a real HTTP receiver on loopback; switched off per project;
a refused or failing webhook said, retried, then given up."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core import mail
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from campaigns.models import Batch, Notification, ProjectAlerts, Unit, UnitState
from campaigns.watch import events, notify
from tests.conftest import waiting_at_checkpoint


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps what it was sent and answers
    `status` (a list: one answer a request, the last one repeated)."""

    def __init__(self, statuses=(200,)):
        self.received: list[dict] = []
        self.statuses = list(statuses)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append({"headers": self.headers, "body": body})
                status = (
                    receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                )
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True  # the receiver is on loopback
    made = []

    def make(statuses=(200,)):
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def campaign(make_campaign, owner):
    owner.email = "owner@example.org"
    owner.save()
    return make_campaign("texts")


def _hook(campaign, url, **fields):
    return ProjectAlerts.objects.update_or_create(
        project=campaign.project, defaults={"webhook_url": url, **fields}
    )[0]


def _valid(alerts, delivery) -> bool:
    headers = delivery["headers"]
    signed = headers["X-BriefGPU-Timestamp"].encode() + b"." + delivery["body"]
    expected = hmac.new(alerts.webhook_secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers["X-BriefGPU-Signature"], f"sha256={expected}")


def test_a_checkpoint_sends_one_email_and_one_signed_webhook(campaign, receiver):
    hook = receiver()
    alerts = _hook(campaign, hook.url)
    checkpoint = waiting_at_checkpoint(campaign)

    raised = events.watch_runs()
    assert raised == [f"checkpoint:{checkpoint.pk}"]
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["owner@example.org"]
    assert f"Checkpoint {checkpoint.pk} waits for your decision" in message.subject
    assert "/campaigns/texts/" in message.body

    assert len(hook.received) == 1
    delivery = hook.received[0]
    assert delivery["headers"]["X-BriefGPU-Event"] == "checkpoint"
    assert _valid(alerts, delivery)
    body = json.loads(delivery["body"])
    assert body["event"] == "checkpoint" and body["campaign"] == "texts"
    assert body["data"]["checkpoint"] == checkpoint.pk

    # The next sweeps find the same checkpoint waiting: nothing more is sent.
    assert events.watch_runs() == [] and events.watch_runs() == []
    assert len(mail.outbox) == 1 and len(hook.received) == 1
    sent = Notification.objects.get()
    assert (sent.email, sent.webhook, sent.webhook_status) == ("sent", "sent", 200)


def test_a_tampered_body_does_not_verify(campaign, receiver):
    hook = receiver()
    alerts = _hook(campaign, hook.url)
    waiting_at_checkpoint(campaign)
    events.watch_runs()
    tampered = dict(hook.received[0], body=hook.received[0]["body"].replace(b"texts", b"other"))
    assert not _valid(alerts, tampered)


def test_events_switched_off_are_listed_but_not_sent(campaign, receiver):
    hook = receiver()
    _hook(campaign, hook.url, events=["done"])
    waiting_at_checkpoint(campaign)
    events.watch_runs()
    assert mail.outbox == [] and hook.received == []
    listed = Notification.objects.get()
    assert (listed.event, listed.email, listed.webhook) == ("checkpoint", "off", "off")


def test_a_failing_webhook_is_retried_then_given_up(campaign, receiver, settings):
    settings.WEBHOOK_TRIES = 3
    hook = receiver(statuses=(500, 200))
    _hook(campaign, hook.url, email=False)
    waiting_at_checkpoint(campaign)
    events.watch_runs()
    first = Notification.objects.get()
    assert (first.webhook, first.webhook_status, first.error) == (
        "pending",
        500,
        "webhook: HTTP 500",
    )
    events.watch_runs()  # the next sweep tries again
    assert Notification.objects.get().webhook == "sent"
    assert len(hook.received) == 2
    assert hook.received[0]["headers"]["X-BriefGPU-Delivery"] == str(first.pk)
    assert hook.received[1]["headers"]["X-BriefGPU-Delivery"] == str(first.pk)

    down = receiver(statuses=(503,))
    _hook(campaign, down.url)
    Notification.objects.all().delete()
    for _ in range(5):
        events.watch_runs()
    gave_up = Notification.objects.get()
    assert gave_up.webhook == "failed" and gave_up.tries == 3
    assert len(down.received) == 3


def test_a_webhook_to_a_private_address_is_refused(campaign, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    _hook(campaign, "http://127.0.0.1:9/hook")
    waiting_at_checkpoint(campaign)
    events.watch_runs()
    refused = Notification.objects.get()
    assert refused.webhook == "failed"
    assert "127.0.0.1" in refused.error and "WEBHOOK_ALLOW_PRIVATE" in refused.error
    assert refused.email == "sent"  # the e-mail goes anyway
    assert notify.url_problem("ftp://example.org/") is not None
    assert notify.url_problem("http://169.254.169.254/latest/") is not None


def test_done_and_failures_are_raised_once(campaign, run_here):
    Unit.objects.filter(campaign=campaign).update(state=UnitState.PENDING)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    assert events.watch_runs() == [
        f"done:{Batch.objects.filter(campaign=campaign).latest('pk').pk}"
    ]
    assert events.watch_runs() == []
    assert "The campaign is done" in mail.outbox[0].subject

    ProjectAlerts.objects.create(project=campaign.project, failure_share=0.1)
    bad = list(Unit.objects.filter(campaign=campaign).values_list("pk", flat=True)[:10])
    Unit.objects.filter(pk__in=bad).update(state=UnitState.FAILED, error_class="input_unreadable")
    settings_min = 5
    from django.conf import settings

    settings.WATCH_FAILURE_MIN_UNITS = settings_min
    raised = events.watch_runs()
    assert raised == [f"failures:v{campaign.current_version_id}"]
    note = Notification.objects.get(event="failures")
    assert "input_unreadable (10)" in note.message
    assert events.watch_runs() == []


def test_a_rental_ending_with_outputs_not_exported(campaign, run_here, make_order, tmp_path):
    from portal.models import Order
    from portal.order_states import Status

    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    now = timezone.now()
    order = make_order()
    Order.objects.filter(pk=order.pk).update(
        status=Status.ACTIVE,
        starts_at=now - dt.timedelta(days=6, hours=12),
        ends_at=now + dt.timedelta(hours=12),
        campaign=campaign,
    )
    raised = events.watch_runs()
    assert f"rental_ending:order-{order.pk}" in raised
    note = Notification.objects.get(event="rental_ending")
    assert f"campaign export {campaign.name}" in note.message

    # Exported after its last batch: a second rental's end raises nothing.
    Notification.objects.all().delete()
    call_command("campaign", "export", campaign.name, "--to", str(tmp_path / "out"))
    assert "rental_ending" not in " ".join(events.watch_runs())


def test_a_download_of_the_outputs_counts_as_exported(client, owner, campaign, run_here):
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    client.force_login(owner)
    assert campaign.__class__.objects.get(pk=campaign.pk).exported_at is None
    url = reverse("version_download", args=[campaign.name, 1, "rows.csv"])
    b"".join(client.get(url).streaming_content)
    assert campaign.__class__.objects.get(pk=campaign.pk).exported_at is None  # names only
    url = reverse("version_download", args=[campaign.name, 1, "vectors.npy"])
    b"".join(client.get(url).streaming_content)
    assert campaign.__class__.objects.get(pk=campaign.pk).exported_at is not None


def test_the_alerts_page_is_the_members_own(client, owner, outsider, campaign, settings):
    url = reverse("project_alerts", args=[campaign.project_id])
    client.force_login(outsider)
    assert client.get(url).status_code == 404
    client.force_login(owner)
    page = client.get(url)
    assert page.status_code == 200 and b"webhook-secret" in page.content
    shown = ProjectAlerts.objects.get(project=campaign.project).webhook_secret
    assert shown.encode() in client.get(url).content  # the same secret on every look
    settings.WEBHOOK_ALLOW_PRIVATE = False
    refused = client.post(
        url,
        {
            "events": ["stall"],
            "email": "on",
            "webhook_url": "http://10.0.0.5/",
            "failure_share": "0.2",
        },
    )
    assert b"private, loopback or link-local" in refused.content
    assert ProjectAlerts.objects.get(project=campaign.project).webhook_url == ""
    settings.WEBHOOK_ALLOW_PRIVATE = True
    saved = client.post(
        url,
        {"events": ["stall", "done"], "webhook_url": "http://10.0.0.5/", "failure_share": "0.2"},
    )
    assert b"alerts-saved" in saved.content
    alerts = ProjectAlerts.objects.get(project=campaign.project)
    assert alerts.events == ["stall", "done"] and not alerts.email
    old = alerts.webhook_secret
    client.post(url, {"new_secret": "1"})
    assert ProjectAlerts.objects.get(pk=alerts.pk).webhook_secret != old
