from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
import portal.urls  # the URLconf, and through it every view
from django.test import Client
from django.contrib.auth.models import User
from campaigns.runs import setup
user = User.objects.create_user("u", password="p")
project = setup.project_for_user(name="p", user=user)
setup.campaign_create(name="c", processor="text-embedding", project=project,
                      input_folder=__import__("pathlib").Path(sys.argv[1]))
client = Client()
client.force_login(user)
assert client.get("/campaigns/").status_code == 200
assert client.get("/campaigns/c/").status_code == 200
htmx = {"HX-Request": "true", "HX-Target": "counts"}
assert client.get("/campaigns/c/", headers=htmx).status_code == 286
# Run measures token costs for length grouping (tokenizers, not torch) and enqueues.
from unittest import mock
with mock.patch("campaigns.runs.start.celery_app.send_task"):
    assert client.post("/campaigns/c/run/").status_code == 302
from campaigns.models import Unit
assert not Unit.objects.filter(cost__isnull=True).exists()
print("torch" in sys.modules, "gpuworker" in sys.modules)
"""


def test_urlconf_and_dashboard_leave_torch_unimported(tmp_path, corpus):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env.update(
        {
            "VAR_DIR": str(tmp_path / "var"),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "ALLOWED_HOSTS": "testserver",
        }
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(corpus)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["False", "False"]
