"""A web process keeps what every request uses (Django's apps, URLconf,
templates) out of the full garbage collections once its first request is
answered: a full collection of it paused one view in ~190 for tens of ms
(common/heap.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("entry", ["portal.wsgi", "portal.asgi"])
def test_the_heap_is_frozen_after_the_first_request_and_only_then(entry):
    # A process of its own: the server's, not the test run's heap.
    script = textwrap.dedent(
        f"""
        import asyncio, gc, json
        import {entry} as served
        from django.test import Client, AsyncClient
        before = gc.get_freeze_count()
        if "{entry}" == "portal.wsgi":
            Client().get("/no-such-page/")
        else:
            asyncio.run(AsyncClient().get("/no-such-page/"))
        first = gc.get_freeze_count()
        gc.unfreeze()
        Client().get("/no-such-page/")
        print(json.dumps([before, first, gc.get_freeze_count()]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    before, first, second = (int(n) for n in done.stdout.strip().splitlines()[-1][1:-1].split(","))
    assert before == 0
    assert first > 10_000  # Django and the project, loaded and kept
    assert second == 0  # once a process: a later request settles nothing again
