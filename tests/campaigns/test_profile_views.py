"""The profile report in the browser: start a profile, read what it measured, order its plan.

Done profiles are written by hand here, as a worker would leave them: these
tests are about the pages, not the measuring (tests/gpuworker/test_profiler.py).
"""

from __future__ import annotations

from unittest import mock
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test.html import Element, parse_html
from django.urls import reverse

from campaigns.models import Campaign, Profile, Unit
from campaigns.profiles.corpus import policy_comparison
from campaigns.profiles.estimates import estimate_build
from campaigns.profiles.services import profile_rerun
from campaigns.runs import costs, setup
from portal.celery import app as celery_app
from portal.models import Environment, GpuModel, RentalDuration

MiB = 1024 * 1024
BUDGET = 8192 * MiB
HTMX_REPORT = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "profile-report"}
LEAK_OK = "allocated memory comes back to its baseline after each batch"


def _step(phase, size, cost, reserved_mib, items_per_s, *, fits=True, oom=False):
    compute = size / items_per_s if items_per_s else 0.8
    return {
        "phase": phase,
        "batch_size": size,
        "compute_s": round(compute, 5),
        "prepare_s": round(0.0004 * size, 5),
        "padded": size * cost,
        "real": size * cost,
        "max_cost": cost,
        "peak_allocated": (reserved_mib - 180) * MiB,
        "peak_reserved": reserved_mib * MiB,
        "limit": BUDGET if phase == "count" else int(0.8 * BUDGET),
        "oom": oom,
        "fits": fits,
        "items_per_s": None if oom else items_per_s,
        "tokens_per_s": None if oom else round(items_per_s * cost, 1),
        "write_s_per_item": 0.0 if oom else 0.0006,
        **({} if oom else {"output_bytes_per_item": 1664}),
    }


STEPS = [
    # typical inputs: everything up to the maximum fits the whole budget
    _step("count", 1, 40, 1100, 35.0),
    _step("count", 2, 40, 1150, 66.0),
    _step("count", 4, 40, 1240, 120.0),
    _step("count", 8, 40, 1420, 205.0),
    _step("count", 16, 40, 1790, 310.0),
    _step("count", 32, 40, 2520, 400.0),
    _step("count", 64, 40, 3960, 430.0),
    # heaviest inputs: 16 runs out of memory, the search settles on 12
    _step("heaviest", 1, 256, 1300, 9.0),
    _step("heaviest", 2, 256, 1700, 16.0),
    _step("heaviest", 4, 256, 2500, 27.0),
    _step("heaviest", 8, 256, 4100, 38.0),
    _step("heaviest", 16, 256, 8400, None, fits=False, oom=True),
    _step("heaviest", 12, 256, 5900, 41.0),
    _step("heaviest", 14, 256, 6700, 42.0, fits=False),
    # the chosen size again, four times
    *[_step("leak check", 12, 256, 5900, 41.0) for _ in range(4)],
]


def build_done_profile(campaign: Campaign, *, leak: bool = False) -> Profile:
    """A profile as a CPU worker leaves it, and its estimate."""
    params = campaign.current_version.params
    costs.measure_costs(campaign=campaign, params=params, pending_only=False)
    units = Unit.objects.filter(campaign=campaign)
    heaviest = list(units.order_by("-cost", "pk")[:4])
    profile = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.DONE,
        sample=sorted(units.values_list("pk", flat=True)),
        heavy=[u.pk for u in heaviest],
        margin=0.2,
        memory_budget=BUDGET,
        max_batch_size=64,
        device="CPU (2 threads)",
        runtime={
            "torch": "2.13.0+cpu",
            "threads": 2,
            "budget_source": "PROFILE_CPU_MEMORY_BUDGET_MB",
        },
        steps=STEPS,
        chosen_batch_size=12,
        chosen_peak_reserved=5900 * MiB,
        leak={
            "baseline": 900 * MiB,
            "after": [910 * MiB, 950 * MiB, 990 * MiB, 1030 * MiB]
            if leak
            else [910 * MiB, 911 * MiB, 910 * MiB, 911 * MiB],
            "growth_per_batch": 40 * MiB if leak else 0.3 * MiB,
            "leak": leak,
            "message": "allocated memory grows by 40.0 MiB per batch: something keeps "
            "tensors alive between batches"
            if leak
            else LEAK_OK,
        },
        policies=policy_comparison(campaign=campaign, params=params, batch_size=12),
        heaviest_tried=[{"uid": u.uid, "cost": u.cost} for u in heaviest],
        sample_failures=[{"uid": "bad/empty.txt", "error": "input_invalid"}],
    )
    estimate_build(profile=profile)
    return profile


@pytest.fixture
def campaign(make_campaign):
    return make_campaign("texts")


@pytest.fixture
def done(campaign, catalog):
    return build_done_profile(campaign)


def _report(campaign):
    return reverse("campaign_profile", args=[campaign.name])


def _start(campaign):
    return reverse("campaign_profile_start", args=[campaign.name])


# --- reading the page: django.test.html's tree, with a few finders -----------------


def _all(node, tag: str | None = None, cls: str | None = None, **attrs) -> list[Element]:
    """Elements under node by tag, a class among theirs, and attributes (data_x for data-x)."""
    wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
    found = []
    for child in node.children:
        if isinstance(child, str):
            continue
        own = dict(child.attributes)
        if (
            (tag is None or child.name == tag)
            and (cls is None or cls in (own.get("class") or "").split())
            and all(own.get(k) == v for k, v in wanted.items())
        ):
            found.append(child)
        found.extend(_all(child, tag, cls, **attrs))
    return found


def _one(node, tag: str | None = None, cls: str | None = None, **attrs) -> Element:
    found = _all(node, tag, cls, **attrs)
    assert found, (tag, cls, attrs)
    return found[0]


def _words(node) -> str:
    if isinstance(node, str):
        return node
    return " ".join(" ".join(_words(c) for c in node.children).split())


def _attr(node: Element, name: str) -> str | None:
    return dict(node.attributes).get(name)


def _classes(node: Element) -> list[str]:
    return (_attr(node, "class") or "").split()


def _page(client, campaign, **headers) -> Element:
    return parse_html(client.get(_report(campaign), **headers).content.decode())


def _text(html: str, element_id: str) -> str:
    return _words(_one(parse_html(html), id=element_id))


# --- starting a profile ----------------------------------------------------------


def test_starting_a_profile_needs_a_login(client, campaign):
    response = client.post(_start(campaign), {"margin": "20"})
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))
    assert not Profile.objects.exists()


def test_another_customer_can_neither_start_nor_read_a_profile(client, outsider, done):
    client.force_login(outsider)
    campaign = done.campaign
    assert client.post(_start(campaign), {"margin": "20"}).status_code == 404
    assert client.get(_report(campaign)).status_code == 404
    wrong_name = reverse("campaign_profile", args=["no-such-campaign"])
    assert client.get(wrong_name).status_code == 404
    assert Profile.objects.count() == 1


def test_starting_a_profile_is_a_post(client, owner, campaign):
    client.force_login(owner)
    assert client.get(_start(campaign)).status_code == 405


def test_a_member_queues_a_profile_and_a_worker_is_told_after_commit(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    with (
        mock.patch.object(celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(_start(campaign), {"margin": "25"}, follow=True)

    profile = Profile.objects.get(campaign=campaign)
    assert profile.state == Profile.State.QUEUED
    assert profile.margin == pytest.approx(0.25)
    send.assert_called_once_with("gpuworker.tasks.run_profile", args=[profile.pk])
    assert response.redirect_chain[-1][0] == _report(campaign)
    html = response.content.decode()
    assert "Profile queued: a worker measures" in html
    assert "25% of memory free" in html
    # the report polls while the worker measures
    assert 'hx-trigger="every 2s"' in html
    assert _text(html, "profile-state").startswith("Queued")


def test_an_empty_margin_takes_the_default_twenty_percent(client, owner, campaign):
    client.force_login(owner)
    with mock.patch.object(celery_app, "send_task"):
        client.post(_start(campaign), {"margin": ""})
    assert Profile.objects.get().margin == pytest.approx(0.2)


@pytest.mark.parametrize("margin", ["95", "-5", "twenty", "nan", "inf"])
def test_a_tampered_margin_queues_nothing_and_says_why(client, owner, campaign, margin):
    client.force_login(owner)
    with mock.patch.object(celery_app, "send_task") as send:
        response = client.post(_start(campaign), {"margin": margin}, follow=True)
    assert not Profile.objects.exists()
    send.assert_not_called()
    html = response.content.decode()
    assert "a percentage from 0 to 90: nothing was queued" in html
    assert "Not profiled yet" in html


def test_the_largest_batch_to_try_is_the_form_s_or_the_default(client, owner, campaign):
    client.force_login(owner)
    with mock.patch.object(celery_app, "send_task"):
        client.post(_start(campaign), {"margin": "20", "max_batch": "64"})
        client.post(_start(campaign), {"margin": "20", "max_batch": ""})
    sizes = list(Profile.objects.order_by("pk").values_list("max_batch_size", flat=True))
    assert sizes == [64, 1024]
    # the form offers again what the latest profile tried
    page = _page(client, campaign)
    assert _attr(_one(page, "input", name="max_batch"), "value") == "1024"


@pytest.mark.parametrize("max_batch", ["0", "65537", "lots", "1.5", "-4"])
def test_a_tampered_largest_batch_queues_nothing_and_says_why(client, owner, campaign, max_batch):
    client.force_login(owner)
    with mock.patch.object(celery_app, "send_task") as send:
        response = client.post(
            _start(campaign), {"margin": "20", "max_batch": max_batch}, follow=True
        )
    assert not Profile.objects.exists()
    send.assert_not_called()
    assert "a whole number from 1 to 65536: nothing was queued" in response.content.decode()


# --- the report ---------------------------------------------------------------


def test_a_campaign_never_profiled_offers_to_profile_it(client, owner, campaign):
    client.force_login(owner)
    response = client.get(_report(campaign))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Not profiled yet" in html
    assert f'action="{_start(campaign)}"' in html
    assert "hx-trigger" not in html


def test_the_report_shows_the_chosen_size_and_the_margin_it_keeps(client, owner, done):
    client.force_login(owner)
    html = client.get(_report(done.campaign)).content.decode()
    assert _text(html, "profile-device") == "CPU (2 threads)"
    assert "torch 2.13.0+cpu" in _text(html, "profile-runtime")
    assert _text(html, "profile-budget") == "8.0 GB"
    assert _text(html, "profile-budget-source") == "(PROFILE_CPU_MEMORY_BUDGET_MB)"
    assert "20% kept free" in _text(html, "profile-margin")
    chosen = _text(html, "chosen")
    assert "Chosen batch size 12" in chosen
    assert "5.8 GB on the heaviest inputs" in chosen  # 5900 MiB
    assert "(28.0%) of the 8.0 GB budget free" in chosen
    assert "hx-trigger" not in html


def test_the_report_lists_every_step_and_marks_the_ones_that_did_not_fit(client, owner, done):
    client.force_login(owner)
    steps = _one(_page(client, done.campaign), id="steps")
    assert len(_all(_one(steps, "tbody"), "tr")) == len(STEPS)
    oom = _one(steps, "tr", data_phase="heaviest", data_batch="16")
    assert _words(oom).endswith("OOM") and "failed" in _classes(oom)
    over = _one(steps, "tr", data_phase="heaviest", data_batch="14")
    assert _words(over).endswith("over the limit") and "failed" in _classes(over)
    # batch, prepare, compute and write seconds (0.6 ms × 64), items/s, tokens/s
    # (430 × 40), peak allocated, peak reserved, result
    count64 = _one(steps, "tr", data_phase="count", data_batch="64")
    assert _words(count64) == "count 64 0.026 0.149 0.038 430.0 17,200 3.7 GB 3.9 GB fits"
    headers = [_words(th) for th in _all(_one(steps, "thead"), "th")]
    assert headers[2:5] == ["Prepare s", "Compute s", "Write s"]


def test_the_charts_draw_both_sweeps_the_budget_lines_and_the_failures(client, owner, done):
    client.force_login(owner)
    page = _page(client, done.campaign)
    memory = _one(_one(page, id="memory-chart"), "svg")
    names = [_words(p) for p in _all(memory, "polyline")]
    assert names == [
        "count: peak reserved",
        "count: peak allocated",
        "heaviest: peak reserved",
        "heaviest: peak allocated",
    ]
    rules = [_words(line) for line in _all(memory, "line", cls="rule")]
    assert rules == ["budget 8.0 GB", "limit with 20% margin 6.4 GB"]
    # 16 (out of memory) and 14 (over the limit), in reserved and allocated
    assert len(_all(memory, "circle", cls="failed")) == 4
    throughput = _one(_one(page, id="throughput-chart"), "svg")
    assert [_words(p) for p in _all(throughput, "polyline")] == [
        "count: items/s",
        "heaviest: items/s",
    ]
    failed = [_words(c) for c in _all(throughput, "circle", cls="failed")]
    assert failed == [
        "heaviest, batch 14: 42 items/s, over the limit",
        "heaviest, batch 16: no result, out of memory",
    ]
    # the out-of-memory step gave no rate: marked on the axis, left out of the line
    heaviest_line = _all(throughput, "polyline")[1]
    assert len(_attr(heaviest_line, "points").split()) == 6


def test_the_report_shows_the_heaviest_inputs_the_failures_and_the_leak_verdict(
    client, owner, done
):
    client.force_login(owner)
    html = client.get(_report(done.campaign)).content.decode()
    heaviest = _text(html, "heaviest")
    for row in done.heaviest_tried:
        assert row["uid"] in heaviest
    assert "bad/empty.txt: input_invalid" in _text(html, "sample-failures")
    leak = _one(parse_html(html), id="leak")
    assert _words(leak) == f"Leak check: {LEAK_OK}."
    assert "error" not in _classes(leak)


def test_a_leak_is_highlighted(client, owner, campaign, catalog):
    build_done_profile(campaign, leak=True)
    client.force_login(owner)
    leak = _one(_page(client, campaign), id="leak")
    assert "grows by 40.0 MiB per batch" in _words(leak)
    assert "error" in _classes(leak)


def test_the_report_compares_the_batching_policies(client, owner, done):
    client.force_login(owner)
    policies = _one(_page(client, done.campaign), id="profile-policies")
    rows = _all(_one(policies, "tbody"), "tr")
    assert [_attr(r, "data-policy") for r in rows] == ["original", "length_grouped", "token_budget"]
    original = done.policies[0]
    cells = [_words(td) for td in _all(rows[0], "td")]
    assert cells[1] == str(original["batches"])
    assert cells[0] == "original"
    assert float(cells[4].removeprefix("×")) == pytest.approx(original["padding"], abs=0.01)


def test_the_estimate_labels_measured_hours_and_projections_plainly(client, owner, done):
    estimate = done.estimate
    # the demo corpus is tiny; a real one takes hours, a small one minutes
    estimate.hours_measured_device, estimate.hours_naive = 12.345, 0.05
    estimate.save()
    client.force_login(owner)
    html = client.get(_report(done.campaign)).content.decode()
    assert _text(html, "hours-measured").startswith("12.35 h on CPU (2 threads) (measured)")
    assert _text(html, "hours-naive").startswith("3 min: the sample's mean time per input")
    assert f"cards of {estimate.memory_tier_gb} GB or more" in _text(html, "memory-tier")
    assert estimate.memory_tier_gb == 24  # 5.8 GB / 0.8
    assert "KB" in _text(html, "output-size") or "bytes" in _text(html, "output-size")
    projections = _one(parse_html(html), id="projections")
    kinds = [_words(td) for td in _all(projections, "td") if _attr(td, "data-kind")]
    # a CPU is no catalog card: every card's hours are projections
    assert kinds == ["projection"] * GpuModel.objects.count()
    assert "under a minute" in _words(projections)
    plan = _text(html, "plan")
    assert f"{estimate.quantity} × {estimate.gpu_name} for {estimate.duration_days} days" in plan
    reasons = [_words(li) for li in _all(_one(parse_html(html), id="reasoning"), "li")]
    assert len(reasons) == len(estimate.reasoning)
    assert "projections from relative throughput" in reasons[0]


def test_order_this_plan_links_to_the_configurator_prefilled_with_the_plan(client, owner, done):
    estimate = done.estimate
    client.force_login(owner)
    link = _one(_page(client, done.campaign), "a", id="order-plan")
    assert _words(link) == "Order this plan"
    url = urlsplit(_attr(link, "href"))
    assert url.path == reverse("order_new")
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert query == {
        "campaign": "texts",
        "profile": str(done.pk),
        "min_memory_gb": "24",
        "gpu": str(GpuModel.objects.get(name=estimate.gpu_name).pk),
        "quantity": str(estimate.quantity),
        "duration": str(RentalDuration.objects.get(days=estimate.duration_days).pk),
        # the profile ran torch 2.13: the first 2.13 environment in the catalog
        "environment": str(Environment.objects.get(name="BriefGPU worker 0.1").pk),
    }


def test_no_order_link_without_a_plan(client, owner, done):
    done.estimate.__class__.objects.filter(pk=done.estimate.pk).update(
        gpu_name="", quantity=None, duration_days=None
    )
    client.force_login(owner)
    html = client.get(_report(done.campaign)).content.decode()
    assert "No plan to recommend" in html
    assert 'id="order-plan"' not in html


def test_a_failed_profile_shows_its_error(client, owner, campaign):
    Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.FAILED,
        error="ValueError: no input of the sample could be read: nothing to measure",
    )
    client.force_login(owner)
    html = client.get(_report(campaign)).content.decode()
    assert _text(html, "profile-error") == (
        "The profile failed: ValueError: no input of the sample could be read: nothing to measure"
    )
    assert "Profile again" in html
    assert 'id="order-plan"' not in html


# --- polling ---------------------------------------------------------------------


def test_the_htmx_poll_returns_only_the_report_and_stops_once_done(client, owner, done):
    client.force_login(owner)
    response = client.get(_report(done.campaign), **HTMX_REPORT)
    html = response.content.decode()
    assert response.status_code == 286  # htmx: swap in the final report, then stop polling
    assert html.lstrip().startswith('<section id="profile-report"')
    assert "<html" not in html
    assert "hx-trigger" not in html
    assert 'id="order-plan"' in html
    assert 'id="profile-again"' not in html


@pytest.mark.parametrize("state", [Profile.State.QUEUED, Profile.State.RUNNING])
def test_the_report_keeps_polling_while_a_worker_measures(client, owner, campaign, state):
    Profile.objects.create(campaign=campaign, version=campaign.current_version, state=state)
    client.force_login(owner)
    response = client.get(_report(campaign), **HTMX_REPORT)
    assert response.status_code == 200
    assert 'hx-trigger="every 2s"' in response.content.decode()


def test_the_poll_stops_when_the_profile_failed(client, owner, campaign):
    Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.FAILED,
        error="RuntimeError: worker lost",
    )
    client.force_login(owner)
    response = client.get(_report(campaign), **HTMX_REPORT)
    assert response.status_code == 286
    assert "worker lost" in response.content.decode()


# --- the campaign page --------------------------------------------------------


def test_the_campaign_page_offers_a_profile_and_links_the_latest(client, owner, campaign, catalog):
    client.force_login(owner)
    detail = reverse("campaign_detail", args=[campaign.name])
    html = client.get(detail).content.decode()
    assert f'action="{_start(campaign)}"' in html
    assert 'id="latest-profile"' not in html

    build_done_profile(campaign)
    link = _one(parse_html(client.get(detail).content.decode()), "a", id="latest-profile")
    assert _attr(link, "href") == _report(campaign)
    assert _words(link) == "Latest profile (done, batch 12)"


# --- re-running a sample and comparing two profiles ---------------------------------


def _rerun(campaign, profile):
    return reverse("campaign_profile_rerun", args=[campaign.name, profile.pk])


def test_re_run_this_sample_queues_the_same_sample_and_compares_the_two(
    client, owner, done, django_capture_on_commit_callbacks
):
    campaign = done.campaign
    # the campaign moved on to other parameters since the profile
    setup.version_create(campaign=campaign, params={"max_tokens": 128})
    client.force_login(owner)
    form = _one(_page(client, campaign), "form", id="profile-rerun")
    assert _attr(form, "action") == _rerun(campaign, done)

    with (
        mock.patch.object(celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(_rerun(campaign, done), follow=True)

    again = Profile.objects.exclude(pk=done.pk).get()
    assert again.state == Profile.State.QUEUED
    assert (again.sample, again.heavy, again.version) == (done.sample, done.heavy, done.version)
    send.assert_called_once_with("gpuworker.tasks.run_profile", args=[again.pk])
    assert response.redirect_chain[-1][0] == f"{_report(campaign)}?compare={done.pk}"
    html = response.content.decode()
    assert f"Profile {again.pk} queued: the sample of profile {done.pk} again" in html
    # the report polls with the comparison kept, and shows it already
    report = _one(parse_html(html), id="profile-report")
    assert _attr(report, "hx-get") == f"{_report(campaign)}?compare={done.pk}"
    compare = _one(report, id="profile-compare")
    assert "The same sample" in _words(compare)
    chosen = _one(compare, "tr", data_field="chosen_batch_size")
    assert _words(chosen) == "Chosen batch size — 12"
    # no re-run of a profile that is still measuring
    assert 'id="profile-rerun"' not in html


def test_two_profiles_side_by_side(client, owner, campaign, catalog):
    # given: a profile, and a re-run of its sample that went faster with a larger batch
    first = build_done_profile(campaign)
    second = profile_rerun(profile=first)
    Profile.objects.filter(pk=second.pk).update(
        state=Profile.State.DONE,
        device="NVIDIA L4",
        steps=[
            *STEPS[:9],
            _step("heaviest", 16, 256, 7000, 60.0),
            _step("leak check", 16, 256, 7000, 60.0),
        ],
        chosen_batch_size=16,
        chosen_peak_reserved=7000 * MiB,
    )
    second.refresh_from_db()
    estimate_build(profile=second)
    client.force_login(owner)

    # when
    page = parse_html(client.get(f"{_report(campaign)}?compare={first.pk}").content.decode())

    # then: chosen batch, peak reserved, items/s and hours, each with the change
    compare = _one(page, id="profile-compare")
    rows = {
        _attr(tr, "data-field"): [_words(td) for td in _all(tr, "td")]
        for tr in _all(compare, "tr")
        if _attr(tr, "data-field")
    }
    assert rows["device"][:2] == ["NVIDIA L4", "CPU (2 threads)"]
    assert rows["chosen_batch_size"] == ["16", "12", "+33.3%"]
    assert rows["chosen_peak_reserved"][:2] == ["6.8 GB", "5.8 GB"]
    assert rows["items_per_s"] == ["60.0", "41.0", "+46.3%"]
    hours_this, hours_other = (
        second.estimate.hours_measured_device,
        first.estimate.hours_measured_device,
    )
    assert rows["hours"][:2] == [f"{hours_this:.3f} h", f"{hours_other:.3f} h"]
    # the earlier profile is listed with a link to compare
    earlier = _one(page, id="earlier-profiles")
    link = _one(earlier, "a")
    assert _attr(link, "href") == f"{_report(campaign)}?compare={first.pk}"


def test_a_comparison_with_another_campaigns_profile_is_not_found(
    client, owner, done, make_campaign
):
    other = build_done_profile(make_campaign("other-texts"))
    client.force_login(owner)
    assert client.get(f"{_report(done.campaign)}?compare={other.pk}").status_code == 404
    assert client.get(f"{_report(done.campaign)}?compare=abc").status_code == 404


def test_re_running_needs_the_campaign_and_a_post(client, owner, outsider, done):
    client.force_login(outsider)
    assert client.post(_rerun(done.campaign, done)).status_code == 404
    client.force_login(owner)
    assert client.get(_rerun(done.campaign, done)).status_code == 405
    assert Profile.objects.count() == 1


def test_re_run_pressed_twice_queues_one_profile(client, owner, done):
    client.force_login(owner)
    with mock.patch.object(celery_app, "send_task"):
        client.post(_rerun(done.campaign, done))
        response = client.post(_rerun(done.campaign, done), follow=True)
    again = Profile.objects.exclude(pk=done.pk).get()
    assert (
        f"Profile {again.pk} is still measuring: nothing was queued." in response.content.decode()
    )


def test_a_profile_still_measuring_is_not_re_run(client, owner, done):
    Profile.objects.filter(pk=done.pk).update(state=Profile.State.RUNNING)
    client.force_login(owner)
    with mock.patch.object(celery_app, "send_task") as send:
        response = client.post(_rerun(done.campaign, done), follow=True)
    send.assert_not_called()
    assert Profile.objects.count() == 1
    assert f"Profile {done.pk} is still measuring: nothing was queued." in response.content.decode()


# --- the memory tier ------------------------------------------------------------------


def test_a_batch_above_the_largest_tier_is_said_and_a_smaller_one_planned(
    client, owner, campaign, catalog
):
    GB = 1024 * MiB
    profile = build_done_profile(campaign)
    steps = [
        _step("heaviest", size, 256, peak * 1024, 100.0)
        for size, peak in ((64, 15), (128, 30), (256, 60), (512, 110))
    ]
    Profile.objects.filter(pk=profile.pk).update(
        steps=steps, chosen_batch_size=512, chosen_peak_reserved=110 * GB, memory_budget=141 * GB
    )
    profile.refresh_from_db()
    estimate = estimate_build(profile=profile)
    client.force_login(owner)
    page = _page(client, campaign)

    exceeded = _words(_one(page, id="tier-exceeded"))
    assert (
        "At batch 512 the heaviest inputs need more memory than the largest tier (80 GB)"
        in exceeded
    )
    assert f"the plan runs batch {estimate.batch_size}" in exceeded
    tiers = _one(page, id="memory-tiers")
    assert [_words(td) for td in _all(_one(tiers, "tr", data_tier="24"), "td")][:2] == [
        "24 GB",
        "64",
    ]
    assert [_words(td) for td in _all(_one(tiers, "tr", data_tier="80"), "td")][:2] == [
        "80 GB",
        "256",
    ]
    memory = _words(_one(page, id="memory-tier"))
    assert f"cards of {estimate.memory_tier_gb} GB or more" in memory
    assert f"at batch {estimate.batch_size}" in memory


def test_the_hardest_inputs_say_why_they_were_tried(client, owner, done):
    Profile.objects.filter(pk=done.pk).update(
        heaviest_tried=[
            {"uid": "long.txt", "cost": 256, "why": "heaviest"},
            {"uid": "oom.txt", "cost": 40, "why": "failed before: out_of_memory"},
            {"uid": "wide.png", "cost": 4000, "why": "widest"},
        ]
    )
    client.force_login(owner)
    rows = _all(_one(_page(client, done.campaign), id="heaviest"), "tr")
    assert [_words(r) for r in rows[1:]] == [
        "long.txt 256 heaviest",
        "oom.txt 40 failed before: out_of_memory",
        "wide.png 4,000 widest",
    ]


# --- the environment of "Order this plan" ----------------------------------------------


def _order_query(client, campaign) -> dict:
    link = _one(_page(client, campaign), "a", id="order-plan")
    return {k: v[0] for k, v in parse_qs(urlsplit(_attr(link, "href")).query).items()}


@pytest.mark.parametrize(
    ("runtime", "environment"),
    [
        ({"torch": "2.8.1+cu128", "cuda": "12.8"}, "PyTorch 2.8"),
        ({"torch": "2.13.0+cu130", "cuda": "13.0"}, "BriefGPU worker 0.1"),
        # a CPU profile has no CUDA to match: torch alone
        ({"torch": "2.13.0+cpu"}, "BriefGPU worker 0.1"),
    ],
)
def test_order_this_plan_picks_the_environment_of_the_same_torch_and_cuda(
    client, owner, done, runtime, environment
):
    Profile.objects.filter(pk=done.pk).update(runtime=runtime)
    client.force_login(owner)
    query = _order_query(client, done.campaign)
    assert query["environment"] == str(Environment.objects.get(name=environment).pk)
    note = _one(_page(client, done.campaign), id="environment-match")
    assert _words(note).startswith(f"Environment: {environment}: torch")
    assert "error" not in _classes(note)


@pytest.mark.parametrize(
    "runtime",
    [
        # torch 2.13 is in the catalog, but only with CUDA 13.0
        {"torch": "2.13.0+cu128", "cuda": "12.8"},
        # no torch 2.1 at all (and 2.1 is not 2.13)
        {"torch": "2.1.2", "cuda": "13.0"},
    ],
)
def test_order_this_plan_prefills_no_environment_when_none_matches_and_says_so(
    client, owner, done, runtime
):
    Profile.objects.filter(pk=done.pk).update(runtime=runtime)
    client.force_login(owner)
    query = _order_query(client, done.campaign)
    assert "environment" not in query
    assert {"gpu", "quantity", "duration"} <= set(query)
    note = _one(_page(client, done.campaign), id="environment-match")
    assert "no catalog environment has torch" in _words(note)
    assert f"CUDA {runtime['cuda']}" in _words(note)
    assert "error" in _classes(note)


def test_the_throughput_axis_reads_as_people_write_rates():
    """Ticks of a fast model read 1,460, not 1.46e+03; slow ones keep decimals."""
    from campaigns.profiles import charts as profile_charts

    fast = Profile(steps=[{**step, "items_per_s": 5549.9} for step in STEPS[:7]])
    labels = [t.label for t in profile_charts.throughput_chart(fast).y_ticks]
    assert labels[-1] == f"{5549.9 * 1.05:,.0f}" and "e+" not in "".join(labels)
    slow = Profile(steps=[{**step, "items_per_s": 0.8} for step in STEPS[:7]])
    assert [t.label for t in profile_charts.throughput_chart(slow).y_ticks][-1] == "0.84"
