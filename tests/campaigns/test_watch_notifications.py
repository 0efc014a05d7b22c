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
                receiver.received.append({"headers": self.headers, "body": body, "path": self.path})
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


def test_the_webhook_connects_to_the_address_it_checked(campaign, receiver):
    """The URL's name is resolved once, checked, and connected to; the Host
    header keeps the name (a name that resolved elsewhere a moment later,
    DNS rebinding, is not asked again)."""
    hook = receiver()
    _hook(campaign, hook.url.replace("127.0.0.1", "localhost"))
    waiting_at_checkpoint(campaign)
    events.watch_runs()
    assert len(hook.received) == 1
    assert hook.received[0]["headers"]["Host"] == f"localhost:{hook.server.server_port}"


def test_a_webhook_that_does_not_answer_is_said_without_the_networks_words(campaign, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    _hook(campaign, "http://127.0.0.1:9/hook", email=False)  # nothing listens there
    waiting_at_checkpoint(campaign)
    events.watch_runs()
    failed = Notification.objects.get()
    assert failed.webhook == "pending" and failed.webhook_status is None
    assert failed.error == "webhook: could not connect, or the answer was not HTTP"


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
    assert "port" in notify.url_problem("http://example.org:99999/")


def test_done_and_failures_are_raised_once(campaign, run_here, settings):
    Unit.objects.filter(campaign=campaign).update(state=UnitState.PENDING)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)  # the demo corpus: 4 of its 39 inputs are invalid
    assert events.watch_runs() == [
        f"done:{Batch.objects.filter(campaign=campaign).latest('pk').pk}"
    ]
    assert events.watch_runs() == []
    assert "The campaign is done" in mail.outbox[0].subject

    # 4 of 39 is 10.3%: above a 10% threshold once 30 units count.
    settings.WATCH_FAILURE_MIN_UNITS = 30
    ProjectAlerts.objects.create(project=campaign.project, failure_share=0.1)
    raised = events.watch_runs()
    assert raised == [f"failures:v{campaign.current_version_id}"]
    note = Notification.objects.get(event="failures")
    assert "4 of the 39 units" in note.message and "input_invalid (4)" in note.message
    assert events.watch_runs() == []


def test_a_new_version_does_not_inherit_the_old_ones_failures(campaign, run_here, settings):
    """Input errors stay failed across versions (the unit rows keep them): a
    new version's share starts from its own batches, not at 100%."""
    from campaigns.runs import setup

    settings.WATCH_FAILURE_MIN_UNITS = 1
    ProjectAlerts.objects.create(project=campaign.project, failure_share=0.5)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    setup.version_create(campaign=campaign, params={"max_tokens": 128})
    campaign.refresh_from_db()
    assert Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).count() == 4
    assert not [r for r in events.watch_runs() if r.startswith("failures")]


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

    # An older version's matrix is not the current outputs.
    from campaigns.runs import setup

    setup.version_create(campaign=campaign, params={"max_tokens": 128})
    campaign.__class__.objects.filter(pk=campaign.pk).update(exported_at=None)
    b"".join(client.get(url).streaming_content)
    assert campaign.__class__.objects.get(pk=campaign.pk).exported_at is None


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
    bad_port = client.post(
        url,
        {"events": ["stall"], "webhook_url": "http://example.org:99999/", "failure_share": "0.2"},
    )
    assert bad_port.status_code == 200 and b"not a port number" in bad_port.content
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


def test_a_stall_is_notified_once_a_lease_has_passed_and_only_once(campaign, settings):
    """The banner shows a proven cause at once; the notification waits a
    lease (a worker restarting for a deploy registers again within it), then
    goes once for the whole stall, however many sweeps see it."""
    from campaigns import selectors
    from campaigns.watch import state
    from tests.campaigns.test_watch_page import _beat, _history, _running

    settings.WORKER_BEAT_SECONDS = 15
    settings.BATCH_LEASE_SECONDS = 60
    _history(campaign)
    _running(campaign)
    _beat(ago=0)
    Batch.objects.filter(state="running").update(
        lease_expires_at=timezone.now() + dt.timedelta(minutes=10)
    )
    # The worker dies now; 50 s later its three beats are missed.
    later = timezone.now() + dt.timedelta(seconds=50)
    counts = selectors.campaign_counts(campaign=campaign)
    shown = state.campaign_stall(campaign=campaign, counts=counts, now=later)
    assert shown is not None and shown.cause == "no_worker"
    assert events.watch_runs(now=later) == []
    for seconds in (65, 125, 600):
        events.watch_runs(now=timezone.now() + dt.timedelta(seconds=seconds))
    assert list(Notification.objects.values_list("event", flat=True)) == ["stall"]
    assert len(mail.outbox) == 1 and "no worker is running" in mail.outbox[0].subject


def test_a_webhook_path_with_accents_is_sent_percent_encoded(campaign, receiver):
    hook = receiver()
    _hook(campaign, hook.url + "/été?to=équipe")
    waiting_at_checkpoint(campaign)
    events.watch_runs()
    assert Notification.objects.get().webhook == "sent"
    assert hook.received[0]["path"] == "/hook/%C3%A9t%C3%A9?to=%C3%A9quipe"


def test_batches_failed_by_dying_workers_count_as_failures(campaign, settings):
    """A batch whose workers kept dying fails whole, unrecorded: its units
    count as the version's failures."""
    settings.WATCH_FAILURE_MIN_UNITS = 10
    version = campaign.current_version
    for state, size, failed in (("done", 20, 0), ("failed", 16, None)):
        Batch.objects.create(
            campaign=campaign,
            version=version,
            size=size,
            state=state,
            finished_at=timezone.now(),
            metrics={} if failed is None else {"failed": failed},
        )
    assert events._version_failures(version.pk) == (16, 36)
