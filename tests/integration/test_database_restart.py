"""PostgreSQL restarts under a live web server and a working worker.

While it is down, pages answer a readable 503 and /health/ names the database;
once it is back, the same server process answers 200 and the worker finishes the
campaign, each unit once. The cluster is this test's own, on a free port:
restarting the shared one would pull the database from under everyone else.
"""

from __future__ import annotations

import contextlib
import glob
import http.client
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from portal.celery import app as celery_app
from tests.conftest import services_required
from tests.integration.test_several_workers import image_corpus
from tests.worker import REPO, Worker, free_port, purge_queue, wait_until

pytestmark = pytest.mark.integration

N_UNITS = 120  # batches of 2: the worker is mid-campaign when the database goes
DOWNTIME = 5  # seconds: longer than a lease (2 s), so the sweeper has work after


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePostgres:
    """initdb + pg_ctl in a temporary folder, trust authentication, TCP on 127.0.0.1."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.port = free_port()
        # Under /tmp and owned by postgres when we are root: initdb refuses to
        # run as root, and the postgres user cannot enter pytest's 0700 tmp_path.
        self.root = Path(tempfile.mkdtemp(prefix="briefgpu-pg-"))
        self.data = self.root / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str, timeout: float = 60) -> None:
        done = subprocess.run(
            [*self.as_user, *args], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode:
            raise RuntimeError(f"{args[0]} failed: {done.stdout[-1500:]}{done.stderr[-1500:]}")

    def init(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        # fsync off: an immediate stop is a crash of the server, not of the
        # machine; PostgreSQL recovers from its WAL in the page cache all the same.
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "start",
        )

    def stop(self) -> None:
        """Immediate: every connection drops, as when the server crashes."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_postgres():
    bindir = _postgres_bin()
    if bindir is None:
        message = "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
        if services_required():
            pytest.fail(message)
        pytest.skip(message)
    server = PrivatePostgres(bindir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.remove()


def _manage(env: dict, *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


# Made in the private database by `manage.py shell`: the owner, the campaign,
# and a logged-in session for the requests.
SETUP = """
from pathlib import Path
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from campaigns.runs import setup

user = get_user_model().objects.create_user("owner", password="pw-for-tests-123")
project = setup.project_for_user(name="acme", user=user)
setup.campaign_create(
    name="pg-restart", processor="image-transform", project=project,
    input_folder=Path({corpus!r}), params={{"batch_size": 2, "width": 16, "height": 16}},
    checkpoint_after=0,
)
session = SessionStore()
session[SESSION_KEY] = str(user.pk)
session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
session[HASH_SESSION_KEY] = user.get_session_auth_hash()
session.create()
print("SESSION", session.session_key)
"""


class Client:
    def __init__(self, port: int, session: str):
        self.port, self.session = port, session

    def get(self, path: str) -> tuple[int, str, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path, headers={"Cookie": f"sessionid={self.session}"})
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace"), dict(response.headers)
        finally:
            conn.close()


def _counts(url: str) -> dict[str, int]:
    with psycopg.connect(url.replace("postgres://", "postgresql://"), connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT u.state, count(*) FROM campaigns_unit u JOIN campaigns_campaign c "
            "ON c.id = u.campaign_id WHERE c.name = 'pg-restart' GROUP BY u.state"
        ).fetchall()
    return dict(rows)


def test_pages_say_503_while_postgresql_restarts_and_the_worker_finishes_after(
    private_postgres, tmp_path, output_root
):
    # given: a private database with a campaign, a web server and a worker on it
    private_postgres._run(
        str(private_postgres.bindir / "createdb"),
        "-h",
        "127.0.0.1",
        "-p",
        str(private_postgres.port),
        "-U",
        "postgres",
        "briefgpu",
    )
    url = private_postgres.url("briefgpu")
    image_corpus(tmp_path / "images", N_UNITS)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CELERY_BROKER_URL": celery_app.conf.broker_write_url,
        "VAR_DIR": str(settings.VAR_DIR),
        "OUTPUT_ROOT": str(output_root),
        "BATCH_LEASE_SECONDS": "2",
        "DEBUG": "false",
        "SECRET_KEY": "test-only-key-" + "x" * 40,
        "SECURE_SSL_REDIRECT": "false",
        # One web process here: its own cache is the shared one.
        "SILENCED_SYSTEM_CHECKS": "django_ratelimit.E003,django_ratelimit.W001",
    }
    _manage(env, "migrate", "--verbosity", "0")
    session = _manage(env, "shell", "-c", SETUP.format(corpus=str(tmp_path / "images")))
    session = session.split("SESSION ")[-1].strip()

    web_port = free_port()
    web_log = (tmp_path / "web.log").open("wb")
    web = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{web_port}", "--noreload"],
        cwd=REPO,
        env=env,
        stdout=web_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    purge_queue()
    worker = Worker(
        tmp_path / "worker.log",
        beat=True,
        env_extra={k: env[k] for k in ("DATABASE_URL", "BATCH_LEASE_SECONDS")},
    )
    client = Client(web_port, session)
    try:

        def web_answers() -> bool:
            try:
                return client.get("/health/")[0] == 200
            except OSError:
                assert web.poll() is None, (tmp_path / "web.log").read_text()[-3000:]
                return False

        wait_until(web_answers, timeout=60)
        page = "/campaigns/pg-restart/"
        status, body, _ = client.get(page)
        assert status == 200 and "pg-restart" in body
        worker.wait_ready()
        _manage(env, "campaign", "run", "pg-restart")
        wait_until(lambda: _counts(url).get("succeeded", 0) >= 6, timeout=60, worker=worker)

        # when: the database goes away mid-campaign
        private_postgres.stop()

        # then: a readable 503, never a traceback, and /health/ says which part is down
        status, body, headers = client.get(page)
        assert status == 503, body[:2000]
        assert "Temporarily unavailable" in body and "Traceback" not in body
        assert headers.get("Retry-After") == "30"
        status, body, _ = client.get("/health/")
        assert status == 503
        health = json.loads(body)
        assert health["database"] != "ok" and health["broker"] == "ok", health
        time.sleep(DOWNTIME)

        # when: it comes back
        private_postgres.start()

        # then: the same server process answers again, without a restart
        wait_until(lambda: client.get(page)[0] == 200, timeout=30)
        assert web.poll() is None
        assert client.get("/health/")[0] == 200

        # and the worker outlived the outage and finishes: each unit once
        def finished() -> bool:
            counts = _counts(url)
            return counts.get("succeeded", 0) + counts.get("failed", 0) == N_UNITS

        wait_until(finished, timeout=120, worker=worker)
    finally:
        worker.stop()
        if web.poll() is None:
            web.terminate()
            web.wait(timeout=20)
        web_log.close()

    assert _counts(url) == {"succeeded": N_UNITS}
    with psycopg.connect(url.replace("postgres://", "postgresql://")) as conn:
        per_unit = conn.execute(
            "SELECT a.unit_id, count(*) FROM campaigns_attempt a "
            "JOIN campaigns_unit u ON u.id = a.unit_id "
            "WHERE a.outcome = 'succeeded' GROUP BY a.unit_id HAVING count(*) > 1"
        ).fetchall()
        states = dict(
            conn.execute("SELECT state, count(*) FROM campaigns_batch GROUP BY state").fetchall()
        )
    assert per_unit == [], "units recorded as done twice"
    assert states == {"done": N_UNITS // 2}, states
    files = [p for p in Path(output_root).rglob("*") if p.is_file()]
    assert len([p for p in files if p.suffix == ".png"]) == N_UNITS
    assert not [p for p in files if p.name.endswith(".tmp")]
    # the worker saw the outage and put its messages back instead of dropping them
    assert "database unavailable" in worker.output()
