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
        import asyncio, gc, io, json
        import {entry} as served

        def wsgi():  # a request through the server's own callable, its response closed
            environ = {{
                "REQUEST_METHOD": "GET", "PATH_INFO": "/no-such-page/", "QUERY_STRING": "",
                "SERVER_NAME": "localhost", "SERVER_PORT": "80", "HTTP_HOST": "localhost",
                "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http", "wsgi.errors": io.StringIO(),
            }}
            body = served.application(environ, lambda status, headers: None)
            b"".join(body)
            body.close()

        def asgi():
            scope = {{
                "type": "http", "method": "GET", "path": "/no-such-page/", "query_string": b"",
                "headers": [(b"host", b"localhost")], "server": ("localhost", 80),
                "scheme": "http", "http_version": "1.1", "asgi": {{"version": "3.0"}},
            }}
            async def run():
                asked, done = [], asyncio.Event()

                async def receive():  # the request, then a disconnect once answered
                    asked.append(1)
                    if len(asked) == 1:
                        return {{"type": "http.request", "body": b"", "more_body": False}}
                    await done.wait()
                    return {{"type": "http.disconnect"}}

                async def send(message):
                    if message["type"] == "http.response.body" and not message.get("more_body"):
                        done.set()

                await served.application(scope, receive, send)

            asyncio.run(run())

        request = wsgi if "{entry}" == "portal.wsgi" else asgi
        before = gc.get_freeze_count()
        request()
        first = gc.get_freeze_count()
        gc.unfreeze()
        request()
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
