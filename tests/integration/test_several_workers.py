"""Several worker processes share one campaign, on the configured broker and on RabbitMQ:
both do work, and every unit succeeds exactly once."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from django.db.models import Count
from PIL import Image

from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import setup, start
from portal.celery import app as celery_app
from tests.conftest import services_required
from tests.worker import purge_queue, use_broker, wait_until

pytestmark = pytest.mark.integration

# RabbitMQ's own default for consumer_timeout (30 min), when rabbitmqctl cannot say.
RABBITMQ_DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000


def image_corpus(root: Path, n: int) -> None:
    """n distinct 32×32 PNGs: the image-transform processor is cheap on them, so
    the broker, the claims and the recording are what the test exercises."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        colour = (i * 37 % 256, i * 91 % 256, i * 53 % 256)
        Image.new("RGB", (32, 32), colour).save(root / f"img-{i:04d}.png")


def image_campaign(project, corpus: Path, *, name: str, batch_size: int):
    campaign, report = setup.campaign_create(
        name=name,
        processor="image-transform",
        project=project,
        input_folder=corpus,
        params={"batch_size": batch_size, "width": 16, "height": 16},
        checkpoint_after=0,  # no stop for a spot check: all batches go at once
    )
    return campaign


def units_in(campaign, state: str) -> int:
    # Straight from the unit rows: what the test checks must not lean on the counters.
    return Unit.objects.filter(campaign=campaign, state=state).count()


def unfinished(campaign) -> int:
    return (
        Unit.objects.filter(campaign=campaign)
        .exclude(state__in=[UnitState.SUCCEEDED, UnitState.FAILED])
        .count()
    )


def assert_each_unit_succeeded_once(campaign, output_root: Path, n: int) -> None:
    assert units_in(campaign, UnitState.SUCCEEDED) == n, dict(
        Unit.objects.filter(campaign=campaign).values_list("state").annotate(n=Count("pk"))
    )
    succeeded = Attempt.objects.filter(unit__campaign=campaign, outcome=Attempt.Outcome.SUCCEEDED)
    per_unit = succeeded.values("unit").annotate(n=Count("pk"))
    assert per_unit.count() == n
    assert not per_unit.filter(n__gt=1).exists(), "a unit was recorded as done twice"
    assert (
        not Attempt.objects.filter(unit__campaign=campaign)
        .exclude(outcome=Attempt.Outcome.SUCCEEDED)
        .exists()
    )
    assert not Batch.objects.filter(campaign=campaign).exclude(state=Batch.State.DONE).exists()
    files = [p for p in output_root.rglob("*") if p.is_file()]
    assert len([p for p in files if p.suffix == ".png"]) == n
    assert not [p for p in files if p.name.endswith(".tmp")]


def _services_pass() -> bool:
    """The second CI pass: PostgreSQL and Redis configured (.ci/run)."""
    return bool(os.environ.get("DATABASE_URL"))


def rabbitmq_consumer_timeout_ms() -> int:
    """The server's consumer_timeout, when rabbitmqctl (same machine, root) can tell."""
    rabbitmqctl = shutil.which("rabbitmqctl")
    if rabbitmqctl:
        try:
            out = subprocess.run(
                [rabbitmqctl, "eval", "application:get_env(rabbit, consumer_timeout)."],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            # {ok,1800000}, or `undefined` when the server has none (never times out)
            if out.startswith("{ok,"):
                return int(out.strip().removeprefix("{ok,").removesuffix("}"))
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
    return RABBITMQ_DEFAULT_CONSUMER_TIMEOUT_MS


def rabbitmq_url() -> str:
    """RABBITMQ_URL, reachable; skipped outside the services pass, failed inside it."""
    url = os.environ.get("RABBITMQ_URL", "")
    if not url:
        if services_required() and _services_pass():
            pytest.fail("REQUIRE_SERVICES=1 on the services pass but RABBITMQ_URL is not set")
        pytest.skip("RABBITMQ_URL is not set (the services pass of .ci/run sets it)")
    try:
        with celery_app.connection_for_write(url) as conn:
            conn.ensure_connection(max_retries=2, timeout=5)
    except Exception as exc:  # noqa: BLE001 — whatever the reason, RabbitMQ is not there
        message = f"RabbitMQ at {url} is unreachable: {exc!r}"
        if services_required():
            pytest.fail(message)
        pytest.skip(message)
    return url


@pytest.fixture(params=["configured", "rabbitmq"])
def broker(request, transactional_db):
    """(broker URL, environment for its workers): the configured broker (the
    filesystem one, or Redis in the services pass), then RabbitMQ."""
    if request.param == "configured":
        yield celery_app.conf.broker_write_url, {}  # start_worker purges it
        return
    url = rabbitmq_url()
    # Check portal.E003 refuses a worker whose longest batch RabbitMQ would not
    # wait for. The server's consumer_timeout (30 min by default) is what the
    # workers are told, and their batch time limit stays under it.
    timeout_ms = rabbitmq_consumer_timeout_ms()
    env = {
        "RABBITMQ_CONSUMER_TIMEOUT_MS": str(timeout_ms),
        "BATCH_TIME_LIMIT": str(min(settings.BATCH_TIME_LIMIT, timeout_ms // 2000)),
    }
    with use_broker(url):
        purge_queue()
        yield url, env


def test_two_workers_share_a_campaign_and_every_unit_succeeds_once(
    broker, start_worker, project, tmp_path, output_root
):
    # given: two workers consuming, 80 small images in batches of 2
    _url, env = broker
    n = 80
    image_corpus(tmp_path / "images", n)
    campaign = image_campaign(project, tmp_path / "images", name="shared", batch_size=2)
    workers = [start_worker(name=f"w{i}", env_extra=env) for i in range(2)]
    for worker in workers:
        worker.wait_ready()

    # when
    assert start.campaign_run(campaign=campaign) == n // 2
    wait_until(lambda: unfinished(campaign) == 0, timeout=180, workers=workers)

    # then: both took batches, and the units were processed once each, no more
    by_worker = dict(
        Batch.objects.filter(campaign=campaign).values_list("worker").annotate(n=Count("pk"))
    )
    assert len(by_worker) == 2, by_worker
    assert all(count >= 2 for count in by_worker.values()), by_worker
    assert_each_unit_succeeded_once(campaign, output_root, n)
    for worker in workers:
        assert "Traceback" not in worker.output(), worker.output()[-3000:]


def test_a_worker_refuses_rabbitmq_that_would_drop_its_longest_batch(start_worker):
    # given: the server's consumer timeout, and a batch time limit above it
    url = rabbitmq_url()
    timeout_ms = rabbitmq_consumer_timeout_ms()
    with use_broker(url):
        worker = start_worker(
            env_extra={
                "RABBITMQ_CONSUMER_TIMEOUT_MS": str(timeout_ms),
                "BATCH_TIME_LIMIT": str(timeout_ms // 1000 + 60),
            }
        )
        # then: it exits at once, saying why (portal.E003), and never consumes
        assert worker.proc.wait(timeout=120) != 0
    assert "refusing to start: portal.E003" in worker.output()
    assert " ready." not in worker.output()
