"""What a profile's estimate assumed, said where it is shown: a chosen batch
that is only the cap, a corpus larger than the campaign profiled, and two
profiles whose software differs."""

from __future__ import annotations

from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.db.models import Avg
from django.test.html import parse_html

from campaigns.models import Profile, Unit
from campaigns.profiles.estimates import estimate_build
from tests.campaigns.test_profile_views import (
    BUDGET,
    STEPS,
    _all,
    _attr,
    _one,
    _report,
    _step,
    _text,
    _words,
    build_done_profile,
)

CAP_REACHED = "the cap was reached — larger batches may fit; raise the cap to look further"


@pytest.fixture
def campaign(make_campaign):
    return make_campaign("texts")


@pytest.fixture
def done(campaign, catalog):
    return build_done_profile(campaign)


# every size up to the cap of 64 fits, on typical and on the heaviest inputs
CAPPED = [
    *STEPS[:7],
    *[_step("heaviest", size, 256, 1300 + 60 * size, 9.0 + size) for size in (1, 2, 4, 8)],
    *[_step("heaviest", size, 256, 1300 + 60 * size, 30.0) for size in (16, 32, 64)],
    *[_step("leak check", 64, 256, 5140, 30.0) for _ in range(4)],
]


def _capped(profile: Profile) -> Profile:
    Profile.objects.filter(pk=profile.pk).update(
        steps=CAPPED, chosen_batch_size=64, chosen_peak_reserved=5140 * 1024 * 1024
    )
    profile.refresh_from_db()
    estimate_build(profile=profile)
    return profile


# --- the cap ---------------------------------------------------------------------


def test_a_chosen_batch_at_the_cap_says_larger_ones_may_fit(client, owner, done):
    profile = _capped(done)
    client.force_login(owner)

    html = client.get(_report(profile.campaign)).content.decode()

    # then: beside the chosen batch, and in the estimate's reasons the plan is sized on
    cap = _text(html, "cap-reached")
    assert "Batch 64 is the largest batch this profile tried (largest batch to try: 64)" in cap
    assert CAP_REACHED in cap
    reasons = [_words(li) for li in _all(_one(parse_html(html), id="reasoning"), "li")]
    assert any(CAP_REACHED in line and "batch 64" in line for line in reasons)


def test_a_batch_chosen_below_a_failure_says_nothing_of_the_cap(client, owner, done):
    client.force_login(owner)
    html = client.get(_report(done.campaign)).content.decode()
    assert 'id="cap-reached"' not in html
    assert CAP_REACHED not in html


# --- the full corpus -------------------------------------------------------------


def test_the_estimate_and_plan_scale_to_a_full_corpus_of_two_million_units(client, owner, done):
    estimate = done.estimate
    client.force_login(owner)

    # when: the user says the full corpus is 2 M documents
    response = client.get(_report(done.campaign), {"corpus": "2M", "corpus_unit": "units"})

    # then: the measured per-unit rate times 2 M, said to be an extrapolation
    html = response.content.decode()
    extrapolation = response.context["extrapolation"]
    factor = 2_000_000 / estimate.units
    assert extrapolation.units == 2_000_000
    assert extrapolation.hours == pytest.approx(estimate.hours_measured_device * factor)
    assert extrapolation.output_bytes == pytest.approx(estimate.output_bytes * factor, abs=1)
    caveat = _text(html, "extrapolation-caveat")
    assert caveat.startswith("Extrapolated, not measured: 2,000,000 units = 2,000,000 units")
    assumptions = _text(html, "extrapolation-assumptions")
    assert "an extrapolation, not a measurement" in assumptions
    assert f"over this campaign's {estimate.units:,} units" in assumptions
    # every card's hours are scaled, and the plan is chosen again on them
    measured = {row["gpu"]: row["hours"] for row in estimate.projections}
    for row in extrapolation.projections:
        if row["hours"] is not None:
            assert row["hours"] == pytest.approx(measured[row["gpu"]] * factor)
    plan = _text(html, "extrapolated-plan")
    assert extrapolation.plan is not None
    assert f"{extrapolation.plan['gpu']} for {extrapolation.plan['days']} days" in plan
    # the form keeps what was asked
    form = _one(parse_html(html), "form", id="corpus-size")
    field = _one(form, "input", name="corpus")
    assert _attr(field, "value") == "2M"


def test_a_corpus_given_in_bytes_counts_units_at_the_mean_input_size(client, owner, done):
    mean = Unit.objects.filter(campaign=done.campaign, size__gt=0).aggregate(m=Avg("size"))["m"]
    client.force_login(owner)

    response = client.get(_report(done.campaign), {"corpus": "1", "corpus_unit": "GB"})

    extrapolation = response.context["extrapolation"]
    assert extrapolation.units == round(10**9 / mean)
    assert f"1 GB is {extrapolation.units:,} units at the mean input size" in _text(
        response.content.decode(), "extrapolation-assumptions"
    )


def test_an_unreadable_corpus_size_says_what_is_expected(client, owner, done):
    client.force_login(owner)
    response = client.get(_report(done.campaign), {"corpus": "lots", "corpus_unit": "units"})
    assert response.status_code == 200
    assert "A corpus size is a number" in _text(response.content.decode(), "extrapolation-error")
    assert 'id="extrapolation"' not in response.content.decode()


# --- comparing profiles ----------------------------------------------------------

CUDA_L4 = {"torch": "2.13.0+cu128", "cuda": "12.8", "driver": "570.86", "device": "NVIDIA L4"}


def _rerun_on_l4(first: Profile, runtime: dict) -> Profile:
    """A re-run of first's sample on another card, as its worker leaves it."""
    from campaigns.profiles.services import profile_rerun

    second = profile_rerun(profile=first)
    Profile.objects.filter(pk=second.pk).update(
        state=Profile.State.DONE,
        device="NVIDIA L4",
        runtime=runtime,
        steps=STEPS,
        chosen_batch_size=12,
        chosen_peak_reserved=5900 * 1024 * 1024,
    )
    second.refresh_from_db()
    estimate_build(profile=second)
    return second


def test_a_comparison_shows_torch_cuda_driver_and_device_and_warns_when_they_differ(
    client, owner, done
):
    first = done
    Profile.objects.filter(pk=first.pk).update(
        device="NVIDIA L4", runtime={**CUDA_L4, "torch": "2.12.1+cu126", "cuda": "12.6"}
    )
    second = _rerun_on_l4(first, CUDA_L4)
    client.force_login(owner)

    html = client.get(_report(first.campaign), {"compare": first.pk}).content.decode()

    compare = _one(parse_html(html), id="profile-compare")
    rows = {
        _attr(tr, "data-field"): [_words(td) for td in _all(tr, "td")]
        for tr in _all(compare, "tr")
        if _attr(tr, "data-field")
    }
    assert second.pk != first.pk
    assert rows["device"] == ["NVIDIA L4", "NVIDIA L4", ""]
    assert rows["torch"] == ["2.13.0+cu128", "2.12.1+cu126", "differs"]
    assert rows["cuda"] == ["12.8", "12.6", "differs"]
    assert rows["driver"] == ["570.86", "570.86", ""]
    warning = _text(html, "software-differs")
    assert "torch 2.12.1+cu126 → 2.13.0+cu128; CUDA 12.6 → 12.8" in warning


def test_the_same_software_on_two_devices_compares_without_a_warning(client, owner, done):
    Profile.objects.filter(pk=done.pk).update(runtime={"torch": "2.13.0+cpu", "threads": 2})
    _rerun_on_l4(done, {"torch": "2.13.0+cpu", "threads": 2})
    client.force_login(owner)
    html = client.get(_report(done.campaign), {"compare": done.pk}).content.decode()
    assert 'id="software-differs"' not in html
    rows = _all(_one(parse_html(html), id="profile-compare"), "tr", data_field="device")
    assert [_words(td) for td in _all(rows[0], "td")][2] == "differs"


def test_campaign_profile_rerun_prints_the_software_rows_and_the_warning(done):
    # given: profile `done` ran torch 2.13 on the CPU; the re-run here records torch 2.14
    def run_here(pk: int) -> str:
        Profile.objects.filter(pk=pk).update(
            state=Profile.State.DONE,
            device="CPU (2 threads)",
            memory_budget=BUDGET,
            runtime={"torch": "2.14.0+cpu", "threads": 2},
            steps=STEPS,
            chosen_batch_size=12,
            chosen_peak_reserved=5900 * 1024 * 1024,
        )
        estimate_build(profile=Profile.objects.get(pk=pk))
        return "done"

    out = StringIO()
    with mock.patch("gpuworker.profiler.profile_run", run_here):
        call_command("campaign", "profile", "texts", "--rerun", str(done.pk), stdout=out)

    text = out.getvalue()
    assert "  torch: 2.13.0+cpu → 2.14.0+cpu  (differs)" in text
    assert "  CUDA: — → —" in text
    assert "warning: the software differs (torch 2.13.0+cpu → 2.14.0+cpu)" in text
