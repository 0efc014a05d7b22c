from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command


def test_campaign_profile_prints_the_steps_the_choice_and_the_estimate(
    make_campaign, output_root, catalog
):
    campaign = make_campaign()
    out = StringIO()
    call_command(
        "campaign",
        "profile",
        campaign.name,
        "--max-batch",
        "4",
        "--sample",
        "6",
        "--heavy",
        "2",
        "--budget-mb",
        "65536",
        stdout=out,
    )
    text = out.getvalue()
    assert "chosen batch size: 4" in text
    assert "heaviest" in text and "count" in text
    assert "leak check: allocated memory comes back" in text
    assert "estimate:" in text and "memory tier" in text


def test_campaign_profile_json_is_the_report(make_campaign, output_root, catalog):
    campaign = make_campaign()
    out = StringIO()
    call_command(
        "campaign",
        "profile",
        campaign.name,
        "--max-batch",
        "2",
        "--sample",
        "4",
        "--heavy",
        "2",
        "--budget-mb",
        "65536",
        "--json",
        stdout=out,
    )
    report = json.loads(out.getvalue())
    assert report["state"] == "done"
    assert report["chosen_batch_size"] == 2
    # the demo corpus's bad inputs were in the sample and failed cleanly
    assert {f["error"] for f in report["sample_failures"]} <= {"input_invalid"}
    assert report["sample_failures"]
    assert report["estimate"]["units"] == campaign.units.count()


def test_a_budget_below_the_model_itself_fails_with_a_reason(make_campaign, output_root, catalog):
    campaign = make_campaign()
    with pytest.raises(CommandError, match="even one of the heaviest inputs needs more"):
        call_command(
            "campaign",
            "profile",
            campaign.name,
            "--max-batch",
            "2",
            "--sample",
            "4",
            "--budget-mb",
            "1",
            stdout=StringIO(),
        )
