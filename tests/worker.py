"""Real Celery worker processes for integration and browser tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from portal.celery import app as celery_app

REPO = Path(__file__).resolve().parent.parent


def database_url() -> str:
    """The URL of the test database this process uses, for the worker to use too."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def purge_queue() -> None:
    """Forget messages left by an earlier run, so they cannot race this one."""
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3)
        # On RabbitMQ purging a queue that was never declared is a channel error.
        with contextlib.suppress(*conn.channel_errors):
            conn.default_channel.queue_purge("gpu")


class Worker:
    def __init__(self, log_path: Path, *, beat: bool = False, env_extra: dict | None = None):
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": database_url(),
                "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
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
                "gpu",
                "-c",
                "1",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
                *(["-B", "-s", str(log_path.with_suffix(".beat"))] if beat else []),
            ],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

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


def wait_until(predicate, *, timeout: float, interval: float = 0.25, worker: Worker | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if worker is not None and worker.proc.poll() is not None:
            raise AssertionError(f"worker exited early:\n{worker.output()[-3000:]}")
        time.sleep(interval)
    detail = f"\nworker log:\n{worker.output()[-3000:]}" if worker else ""
    raise AssertionError(f"condition not met within {timeout}s{detail}")
