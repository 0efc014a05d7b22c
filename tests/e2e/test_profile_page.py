"""The profile page in a browser: re-run a profile's sample, watch the new one
finish in place, and read the two side by side."""

from __future__ import annotations

import re
from unittest import mock

import pytest

from campaigns.models import Profile
from campaigns.profiles.estimates import estimate_build
from portal.celery import app as celery_app
from tests.campaigns.test_profile_views import STEPS, MiB, _step, build_done_profile

pytestmark = pytest.mark.e2e


def test_re_run_this_sample_then_compare_the_two_profiles(
    page, live_server, owner, make_campaign, catalog, transactional_db
):
    campaign = make_campaign("texts")
    first = build_done_profile(campaign)

    # given: the owner reads the campaign's profile report
    page.goto(f"{live_server.url}/campaigns/texts/profile/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/campaigns/texts/profile/")
    assert "Chosen batch size 12" in page.locator("#chosen").inner_text()
    assert "Prepare s" in page.locator("#steps thead").inner_text()

    # when: Re-run this sample (no worker here: the task is only recorded)
    with mock.patch.object(celery_app, "send_task") as send:
        page.click("#profile-rerun button")
        page.wait_for_url(re.compile(rf".*/campaigns/texts/profile/\?compare={first.pk}$"))
    again = Profile.objects.exclude(pk=first.pk).get()
    send.assert_called_once_with("gpuworker.tasks.run_profile", args=[again.pk])
    assert page.locator("#profile-state").inner_text().startswith("Queued")
    assert again.sample == first.sample and again.version_id == first.version_id

    # and a worker finishes it, faster at a larger batch
    Profile.objects.filter(pk=again.pk).update(
        state=Profile.State.DONE,
        device="NVIDIA L4",
        steps=[*STEPS[:9], _step("heaviest", 16, 256, 7000, 60.0)],
        chosen_batch_size=16,
        chosen_peak_reserved=7000 * MiB,
    )
    again.refresh_from_db()
    estimate_build(profile=again)

    # then: the report, polling with the comparison kept, shows the two side by side
    page.wait_for_selector("#profile-report[data-state=done]")
    compare = page.locator("#profile-compare")
    assert "The same sample" in compare.inner_text()
    chosen = compare.locator("tr[data-field=chosen_batch_size] td")
    assert chosen.all_inner_texts() == ["16", "12", "+33.3%"]
    rate = compare.locator("tr[data-field=items_per_s] td")
    assert rate.all_inner_texts()[:2] == ["60.0", "41.0"]
    assert page.locator("#profile-compare tr[data-field=hours] td").count() == 3
    # the first profile is listed among the earlier ones, and the new one can be re-run
    assert page.locator(f"#earlier-profiles li[data-profile='{first.pk}']").count() == 1
    assert page.locator("#profile-rerun button").is_visible()
