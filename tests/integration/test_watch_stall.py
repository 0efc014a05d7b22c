"""Watching a run through real workers: the live workers panel lists the
worker process from its own heartbeat row; a worker SIGKILLed mid-run raises
the stall banner and one notification; a run that reaches its checkpoint
sends one e-mail and one signed webhook."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from campaigns import selectors
from campaigns.models import Batch, Campaign, Notification, ProjectAlerts, WorkerBeat
from campaigns.runs import setup, start
from campaigns.watch import events, state
from tests.worker import wait_until

pytestmark = pytest.mark.integration

BEAT = 0.5  # seconds: a killed worker is counted gone after three


def _long_texts(root: Path, n: int) -> None:
    for i in range(n):
        words = " ".join(f"report {i} paragraph {j} with figures {i * j}." for j in range(60))
        (root / f"doc-{i:03d}.txt").write_text(words + "\n")


@pytest.fixture
def beats(settings):
    settings.WORKER_BEAT_SECONDS = BEAT
    return {"WORKER_BEAT_SECONDS": str(BEAT)}


def test_a_worker_killed_mid_run_raises_the_banner_and_one_notification(
    start_worker, beats, project, owner, client, tmp_path, settings
):
    # The worker takes 60 s leases: the dead worker's batch stays "running"
    # meanwhile. The rules here count 2 s ones: a stall is notified after a
    # lease, and this one after three missed beats, 1.5 s.
    settings.BATCH_LEASE_SECONDS = 2
    owner.email = "owner@example.org"
    owner.save()
    corpus = tmp_path / "long"
    corpus.mkdir()
    _long_texts(corpus, 64)
    campaign, _ = setup.campaign_create(
        name="watched",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_size": 8, "batch_policy": "length_grouped"},
        checkpoint_after=0,
    )
    start.campaign_run(campaign=campaign)
    worker = start_worker(env_extra={**beats, "BATCH_LEASE_SECONDS": "60"})
    client.force_login(owner)

    # given: the worker runs, and has finished a batch or more
    wait_until(
        lambda: (
            Batch.objects.filter(campaign=campaign, state="done").exists()
            and Batch.objects.filter(campaign=campaign, state="running").exists()
        ),
        timeout=180,
        worker=worker,
    )
    beat = WorkerBeat.objects.get()
    assert beat.queues == "gpu,portal" and beat.device.startswith("cpu")
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert f'data-worker="{beat.name}" data-live="true"' in html
    assert "stall-banner" not in html
    held = Batch.objects.get(campaign=campaign, state="running")
    assert held.worker == beat.name
    assert f"batch {held.pk} of watched" in html

    # when: the worker is killed while it holds a batch
    worker.kill()

    # then: within three beats the heartbeats prove it, and the page says so
    def stalled() -> bool:
        counts = selectors.campaign_counts(campaign=campaign)
        return (
            state.campaign_stall(
                campaign=Campaign.objects.get(pk=campaign.pk), counts=counts, now=timezone.now()
            )
            is not None
        )

    wait_until(stalled, timeout=30)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert 'id="stall-banner" data-cause="no_worker"' in html
    assert f'data-worker="{beat.name}" data-live="false"' in html

    # and the watch sweep notifies it once, after a lease, however often it runs
    raised: list[str] = []
    wait_until(lambda: bool(raised.extend(events.watch_runs()) or raised), timeout=30)
    raised += events.watch_runs() + events.watch_runs()
    assert [r.split(":")[0] for r in raised] == ["stall"]
    stall = Notification.objects.get(campaign=campaign)
    assert stall.event == "stall" and stall.email == "sent"
    assert [m.subject for m in mail.outbox] == [
        "[watched] The run is stalled: no worker is running"
    ]


class _Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.headers, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_run_reaching_its_checkpoint_sends_one_email_and_one_signed_webhook(
    start_worker, beats, project, owner, corpus, settings
):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    owner.email = "owner@example.org"
    owner.save()
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        alerts = ProjectAlerts.objects.create(
            project=project, webhook_url=f"http://127.0.0.1:{server.server_port}/hook"
        )
        campaign, _ = setup.campaign_create(
            name="first-group",
            processor="text-embedding",
            project=project,
            input_folder=corpus,
            checkpoint_after=5,
        )
        start.campaign_run(campaign=campaign)
        worker = start_worker(env_extra=beats)
        # given: the worker ran the first group, and the checkpoint opened
        wait_until(
            lambda: (
                selectors.campaign_run_state(
                    campaign_id=campaign.pk, counts=selectors.campaign_counts(campaign=campaign)
                ).key
                == "checkpoint"
            ),
            timeout=180,
            worker=worker,
        )
        # when: the watch sweep runs, twice, a minute apart
        events.watch_runs()
        events.watch_runs(now=timezone.now() + dt.timedelta(minutes=1))
        # then: one e-mail, one webhook, signed with the project's secret
        assert len(mail.outbox) == 1 and "waits for your decision" in mail.outbox[0].subject
        assert len(_Receiver.received) == 1
        headers, body = _Receiver.received[0]
        signed = headers["X-BriefGPU-Timestamp"].encode() + b"." + body
        digest = hmac.new(alerts.webhook_secret.encode(), signed, hashlib.sha256).hexdigest()
        assert headers["X-BriefGPU-Signature"] == f"sha256={digest}"
        assert Notification.objects.get().webhook_status == 204
    finally:
        server.shutdown()
        server.server_close()
