"""Log lines name their campaign, batch, unit or order, and never the customer."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import pytest
from pythonjsonlogger.json import JsonFormatter

from campaigns.models import Batch, Unit, UnitState
from portal.log_context import JSON_FORMAT, ContextFilter
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

    lines = [line for line in json_lines() if line["name"] == "gpuworker.batch_runner"]
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
        "from portal.log_context import bound\n"
        "with bound(campaign=7, batch=42):\n"
        "    logging.getLogger('gpuworker.batch_runner').info('hello', extra={'unit': 9})"
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
