"""Log lines name their campaign, batch, unit or order, and never the customer."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import pytest
from django.test import Client
from pythonjsonlogger.json import JsonFormatter

from campaigns.models import Batch, Unit, UnitState
from common.log_context import JSON_FORMAT, ContextFilter
from portal.order_services import order_reject
from tests.conftest import DEMO_BAD
from tests.worker import REPO


@pytest.fixture
def json_lines():
    """What the production handler writes, parsed back: one JSON object per line."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(JSON_FORMAT))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


def test_a_batch_logs_its_campaign_and_batch_and_each_failed_unit(
    make_campaign, run_here, output_root, json_lines
):
    campaign = make_campaign("logged", batch_size=50)
    run_here(campaign)
    batch = Batch.objects.get(campaign=campaign)
    failed = set(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list("pk", flat=True)
    )
    assert len(failed) == DEMO_BAD

    lines = [line for line in json_lines() if line["name"] == "campaigns.runs.recording"]
    summary = next(line for line in lines if "recorded" in line["message"])
    assert (summary["campaign"], summary["batch"]) == (campaign.pk, batch.pk)
    assert f"{DEMO_BAD} failed" in summary["message"]
    unit_lines = [line for line in lines if line["message"].startswith("unit failed")]
    assert {line["unit"] for line in unit_lines} == failed
    assert all(line["batch"] == batch.pk for line in unit_lines)


def test_order_lines_carry_the_reference_and_no_personal_data(make_order, staff, json_lines):
    order = make_order(first_name="Grace", last_name="Hopper", email="grace@example.org")
    order_reject(order=order, actor="staff", note="no payment arrived")

    lines = [line for line in json_lines() if line["name"] == "portal.order_services"]
    assert [line["message"] for line in lines] == [
        "order quoted",
        "order awaiting_payment → rejected",
    ]
    assert {line["order"] for line in lines} == {order.reference}
    everything = json.dumps(json_lines())
    for personal in ("Grace", "Hopper", "grace@example.org"):
        assert personal not in everything


def test_production_settings_write_json_lines():
    # The settings module itself, in a fresh process, as a deployed worker loads it.
    code = (
        "import django, logging; django.setup(); "
        "from common.log_context import bound\n"
        "with bound(campaign=7, batch=42):\n"
        "    logging.getLogger('gpuworker.runner.batch').info('hello', extra={'unit': 9})"
    )
    env = {**os.environ, "LOG_FORMAT": "json", "DJANGO_SETTINGS_MODULE": "portal.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stderr.strip().splitlines()[-1])
    assert line["message"] == "hello"
    assert (line["campaign"], line["batch"], line["unit"]) == (7, 42, 9)
    assert line["levelname"] == "INFO"


# --- tracking tokens never reach the logs ----------------------------------------


@pytest.fixture
def everything_logged():
    """What every configured stream handler writes (Django's own included, if
    any were left), for the duration of the test."""
    stream = io.StringIO()
    loggers = [logging.getLogger()] + [
        logger
        for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    # Exactly StreamHandler: pytest's capture handlers are subclasses, left alone.
    handlers = {h for lg in loggers for h in lg.handlers if type(h) is logging.StreamHandler}
    saved = {handler: handler.setStream(stream) for handler in handlers}
    yield stream.getvalue
    for handler, original in saved.items():
        handler.setStream(original)


def test_responses_on_a_tracking_path_log_the_path_without_the_token(
    client, make_order, settings, everything_logged
):
    # given: a real order's token; DEBUG on, where Django's own console handler writes
    settings.DEBUG = True
    settings.ORDER_NOTICE_RATE = "1/m"
    order = make_order()
    token = order.tracking_token
    paid = f"/order/t/{token}/paid/"

    # when: a 429 (rate limit), a 403 (CSRF) and a 404 on that token's paths
    assert client.post(paid).status_code == 302
    assert client.post(paid).status_code == 429
    assert Client(enforce_csrf_checks=True).post(paid).status_code == 403
    assert client.get(f"/order/t/{token}/no-such-page/").status_code == 404
    # and runserver's request line, as django.core.servers.basehttp writes it
    logging.getLogger("django.server").warning(
        '"%s" %s %s',
        f"GET /order/t/{token}/no-such-page/ HTTP/1.1",
        "404",
        "179",
        extra={"request": None, "server_time": "30/Nov/2026 08:00:00", "status_code": 404},
    )

    # then
    logged = everything_logged()
    assert token not in logged
    assert "Too Many Requests: /order/t/<redacted>/paid/" in logged
    assert "Forbidden (CSRF cookie not set.): /order/t/<redacted>/paid/" in logged
    assert "Not Found: /order/t/<redacted>/no-such-page/" in logged
    assert '"GET /order/t/<redacted>/no-such-page/ HTTP/1.1" 404 179' in logged


def test_a_traceback_that_quotes_a_token_is_redacted(everything_logged):
    try:
        raise ValueError("bad request for /order/t/abcDEF_123-xyz/dossier.zip")
    except ValueError:
        logging.getLogger("django.request").exception("Internal Server Error: %s", "/x/")
    logged = everything_logged()
    assert "abcDEF_123-xyz" not in logged
    assert "ValueError: bad request for /order/t/<redacted>/dossier.zip" in logged


def test_production_json_lines_carry_neither_the_token_nor_the_request(tmp_path):
    # The settings module itself, in a fresh process: LOG_FORMAT=json, as deployed.
    code = (
        "import django; django.setup()\n"
        "from django.test import Client\n"
        "client = Client(enforce_csrf_checks=True)\n"
        "client.get('/order/t/SECRET-token_42/nothing-here/')\n"
        "client.post('/order/t/SECRET-token_42/paid/')\n"
    )
    env = {
        **os.environ,
        "LOG_FORMAT": "json",
        "ALLOWED_HOSTS": "testserver",
        "VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "SECRET-token_42" not in result.stderr + result.stdout
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert {line["message"] for line in lines} == {
        "Not Found: /order/t/<redacted>/nothing-here/",
        "Forbidden (CSRF cookie not set.): /order/t/<redacted>/paid/",
    }
    assert all("request" not in line for line in lines)
