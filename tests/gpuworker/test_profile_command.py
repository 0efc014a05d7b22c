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
    # 4 fitted a 64 GB budget easily: the sweep stopped at the cap, not at memory
    assert (
        "the cap was reached — larger batches may fit; raise the cap to look further "
        "(largest batch to try: 4, --max-batch)"
    ) in text
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


@pytest.fixture
def paced(settings, tmp_path, project):
    """A campaign of the paced test processor (tests/plugins/paced_text.py): no model."""
    from campaigns.runs import setup
    from campaigns.specs import processors as processor_specs
    from gpuworker import processors

    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.paced_text.SPEC"]
    processor_specs._registry.cache_clear()
    processors._load.cache_clear()
    root = tmp_path / "paced"
    root.mkdir()
    for i in range(12):
        (root / f"note-{i:02d}.txt").write_text(f"note {i}: the cache was warm\n")
    for i in range(3):
        (root / f"report-{i}.txt").write_text(" ".join(f"w{j}" for j in range(40)) + "\n")
    campaign, _ = setup.campaign_create(
        name="paced", processor="paced-text", project=project, input_folder=root
    )
    yield campaign
    processor_specs._registry.cache_clear()
    processors._load.cache_clear()


def _profile(*args: str) -> str:
    out = StringIO()
    call_command("campaign", "profile", "paced", *args, stdout=out)
    return out.getvalue()


def test_the_profile_prints_prepare_compute_and_write_seconds_per_step(paced, output_root, catalog):
    from campaigns.models import Profile

    text = _profile("--max-batch", "2", "--sample", "4", "--heavy", "2", "--budget-mb", "65536")
    header = next(line for line in text.splitlines() if "prepare s" in line)
    assert header.split()[:8] == ["phase", "batch", "prepare", "s", "compute", "s", "write", "s"]
    count2 = next(line for line in text.splitlines() if line.split()[:2] == ["count", "2"])
    prepare, compute, write = (float(v) for v in count2.split()[2:5])
    assert prepare >= 0 and compute >= 0 and write >= 0
    # Measured, not left out: the saved report holds the write's seconds (the
    # table rounds a short write of two rows to 0.000).
    steps = Profile.objects.get().steps
    step = next(s for s in steps if s["phase"] == "count" and s["batch_size"] == 2)
    assert step["write_s_per_item"] > 0


def test_rerun_runs_the_saved_sample_with_its_own_parameters_and_compares(
    paced, output_root, catalog
):
    from campaigns.models import Profile
    from campaigns.runs import setup

    # given: a profile, then the campaign's parameters changed
    _profile("--max-batch", "2", "--sample", "4", "--heavy", "2", "--budget-mb", "65536")
    first = Profile.objects.get()
    setup.version_create(campaign=first.campaign, params={"batch_size": 3})

    # when
    text = _profile("--rerun", str(first.pk))

    # then: the same sample, version and budget (it was given), measured again
    again = Profile.objects.exclude(pk=first.pk).get()
    assert again.state == Profile.State.DONE
    assert (again.sample, again.heavy, again.version) == (first.sample, first.heavy, first.version)
    assert again.memory_budget == first.memory_budget == 65536 * 1024 * 1024
    assert f"re-run of profile {first.pk} (the same sample)" in text
    assert "chosen batch size: 2 → 2 (+0.0%)" in text
    for label in ("peak reserved at the chosen size", "items/s at the chosen size"):
        assert label in text
    assert "estimate, hours on the measured device:" in text


def test_rerun_as_json_carries_the_comparison(paced, output_root, catalog):
    from campaigns.models import Profile

    _profile("--max-batch", "2", "--sample", "4", "--budget-mb", "65536")
    first = Profile.objects.get()
    report = json.loads(_profile("--rerun", str(first.pk), "--budget-mb", "32768", "--json"))
    compared = report["compared_with"]
    assert compared["other"]["profile"] == first.pk
    assert compared["same_sample"] and compared["same_version"]
    assert [row["field"] for row in compared["rows"]] == [
        "chosen_batch_size",
        "chosen_peak_reserved",
        "items_per_s",
        "hours",
    ]
    assert report["memory_budget"] == 32768 * 1024 * 1024  # given again: it wins


def test_rerun_of_an_unknown_profile_fails_with_a_reason(paced, output_root, catalog):
    with pytest.raises(CommandError, match="paced has no profile 999"):
        _profile("--rerun", "999")


def test_a_worker_sharing_its_device_profiles_against_its_share(
    paced, output_root, catalog, settings, monkeypatch, fresh_device
):
    settings.WORKERS_PER_DEVICE = 2
    settings.PROFILE_CPU_MEMORY_BUDGET_MB = 65536
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    text = _profile("--max-batch", "2", "--sample", "4", "--heavy", "2")
    assert "budget 32768 MiB (PROFILE_CPU_MEMORY_BUDGET_MB ÷ 2 (WORKERS_PER_DEVICE))" in text
