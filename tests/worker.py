"""Real Celery worker processes for integration and browser tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from django.conf import settings
from django.db import connection

from portal.celery import app as celery_app

REPO = Path(__file__).resolve().parent.parent
# What a test worker consumes: batches, and the order sweeps (portal.tasks.*).
QUEUES = ("gpu", "portal")


def database_url() -> str:
    """The URL of the test database this process uses, for the worker to use too."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def purge_queue(broker_url: str | None = None) -> None:
    """Forget messages left by an earlier run, so they cannot race this one.

    broker_url: another broker than the one this process sends to.
    """
    with celery_app.connection_for_write(broker_url) as conn:
        conn.ensure_connection(max_retries=3)
        for queue in QUEUES:
            # On RabbitMQ purging a queue that was never declared is a channel
            # error, and it closes the channel: a fresh one for each queue.
            with contextlib.suppress(*conn.channel_errors), conn.channel() as channel:
                channel.queue_purge(queue)


def broker_transport_options(url: str) -> dict:
    """What portal/settings.py gives a worker on this broker, for this process."""
    if url.startswith("redis"):
        return {"visibility_timeout": settings.BATCH_TIME_LIMIT * 2, "socket_connect_timeout": 3}
    if url.startswith("filesystem"):
        return dict(settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    return {}


@contextlib.contextmanager
def use_broker(url: str) -> Iterator[str]:
    """This process sends (campaign_run, the sweeper) to `url`, and Worker()
    starts workers on it, until the block ends.

    Celery reads CELERY_BROKER_URL from the environment before its own
    settings, so the write and read URLs are what is set here: they come first.
    """
    conf = celery_app.conf
    saved = (conf.get("broker_write_url"), conf.get("broker_read_url"))
    saved_options = conf.broker_transport_options

    def reset_pools() -> None:
        # Connections and producers are pooled per URL: forget the old ones.
        celery_app._pool = None
        celery_app.amqp._producer_pool = None

    reset_pools()
    conf.broker_write_url = conf.broker_read_url = url
    conf.broker_transport_options = broker_transport_options(url)
    try:
        yield url
    finally:
        reset_pools()
        conf.broker_write_url, conf.broker_read_url = saved
        conf.broker_transport_options = saved_options


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Worker:
    def __init__(
        self,
        log_path: Path,
        *,
        beat: bool = False,
        env_extra: dict | None = None,
        name: str | None = None,
        concurrency: int = 1,
    ):
        """A `celery worker -Q gpu,portal -c CONCURRENCY` on this test's database and on
        the broker this process sends to (use_broker changes it); env_extra wins over both.

        name: the Celery node name (`-n NAME@%h`), when several run at once.
        concurrency: its pool processes (`-c`).
        """
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": database_url(),
                "CELERY_BROKER_URL": celery_app.conf.broker_write_url,
                "OUTPUT_ROOT": str(settings.OUTPUT_ROOT),
                "VAR_DIR": str(settings.VAR_DIR),
                "HF_HUB_OFFLINE": "1",
                "BATCH_LEASE_SECONDS": str(settings.BATCH_LEASE_SECONDS),
                **(env_extra or {}),
            }
        )
        self.log_path = log_path
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "-Q",
                ",".join(QUEUES),
                "-c",
                str(concurrency),
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
                *(["-B", "-s", str(log_path.with_suffix(".beat"))] if beat else []),
                *(["-n", f"{name}@%h"] if name else []),
            ],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the worker consumes (torch imported, connected to the broker)."""
        wait_until(lambda: " ready." in self.output(), timeout=timeout, worker=self)

    def kill(self) -> None:
        """SIGKILL to the main process and its pool child: what a lost machine looks like."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def wait_until(
    predicate,
    *,
    timeout: float,
    interval: float = 0.25,
    worker: Worker | None = None,
    workers: Sequence[Worker] = (),
):
    """Poll `predicate` until true; fail after `timeout` s or as soon as a worker exits."""
    watched = [*([worker] if worker is not None else []), *workers]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for w in watched:
            if w.proc.poll() is not None:
                raise AssertionError(f"worker exited early:\n{w.output()[-3000:]}")
        time.sleep(interval)
    detail = "".join(f"\nworker log {w.log_path.name}:\n{w.output()[-3000:]}" for w in watched)
    raise AssertionError(f"condition not met within {timeout}s{detail}")


def kill_mid_batch(start_worker, campaign, times: int, *, settle: float = 0.1) -> None:
    """SIGKILL a fresh worker while it holds one of the campaign's batches,
    until `times` kills caught a batch still running (8 tries at most)."""
    from campaigns.models import Batch

    killed = 0
    for _attempt in range(8):
        if killed == times:
            break
        worker = start_worker()
        held = Batch.objects.filter(
            campaign=campaign, state=Batch.State.RUNNING, lease_expires_at__isnull=False
        )
        wait_until(
            lambda held=held: held.exclude(lease_token="").exists(),
            timeout=120,
            interval=0.02,
            worker=worker,
        )
        victim = held.exclude(lease_token="").first()
        time.sleep(settle)
        worker.kill()
        victim.refresh_from_db()
        if victim.state == Batch.State.RUNNING:
            killed += 1
    assert killed == times, f"{killed} of {times} kills caught a batch running"


def finish_and_resume(start_worker, campaign, *, timeout: float = 240) -> None:
    """A new worker (with the sweeper) takes the campaign to its end; a resume
    then puts back whatever is left, and that ends too."""
    from campaigns import selectors
    from campaigns.runs import control

    worker = start_worker(beat=True)
    wait_until(
        lambda: not selectors.campaign_counts(campaign=campaign).active,
        timeout=timeout,
        worker=worker,
    )
    control.campaign_resume(campaign=campaign)
    wait_until(
        lambda: not selectors.campaign_counts(campaign=campaign).active, timeout=120, worker=worker
    )
