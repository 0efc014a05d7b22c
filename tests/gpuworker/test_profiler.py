"""The batch-size profiler on CPU against a memory budget, as on a GPU against its memory."""

from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from PIL import Image

from campaigns import selectors
from campaigns.models import Batch, ErrorClass, Profile, Unit, UnitState
from campaigns.profiles import estimates
from campaigns.profiles.corpus import output_bytes_estimate
from campaigns.profiles.estimates import fit_throughput
from campaigns.profiles.sample import RUN_FAILURES, sample_build, unusual_units
from campaigns.profiles.services import profile_create, profile_rerun, profiles_fail_stale
from campaigns.profiles.tiers import memory_tier, tier_batches
from campaigns.runs import costs, setup
from campaigns.specs import processors as processor_specs
from gpuworker import processors
from gpuworker.memory import StepMemory, allocated_now, cpu
from gpuworker.processors import get_processor
from gpuworker.processors.text_embedding import TextEmbeddingProcessor
from gpuworker.profiler import leak_verdict, profile_run
from tests.plugins import paced_text

MiB = 1024 * 1024
SHORT, LONG = 120, 6


@pytest.fixture
def skewed_corpus(tmp_path):
    """Many short texts and a few long ones: the long ones set the memory."""
    root = tmp_path / "skewed"
    root.mkdir()
    for i in range(SHORT):
        (root / f"short-{i:03d}.txt").write_text(f"note {i}: the cache was warm and fast.\n")
    for i in range(LONG):
        words = " ".join(f"token{i}x{j}" for j in range(400))
        (root / f"long-{i}.txt").write_text(f"report {i}: {words}\n")
    return root


@pytest.fixture
def campaign_for_sweeps(project, skewed_corpus):
    return _campaign(project, skewed_corpus, name="swept")


def _campaign(project, folder, name="skewed", **params):
    campaign, _ = setup.campaign_create(
        name=name,
        processor="text-embedding",
        project=project,
        input_folder=folder,
        params={"max_tokens": 256, **params},
    )
    return campaign


def test_profile_fits_the_heaviest_inputs_with_the_margin_and_a_full_run_stays_under(
    project, skewed_corpus, output_root, run_here, catalog
):
    # given: a budget that lets 64 short texts through but not 64 long ones
    campaign = _campaign(project, skewed_corpus)
    processor = get_processor("text-embedding", campaign.current_version.params)
    processor.embed(["warm up"] * 4)
    baseline = allocated_now(cpu())
    margin = 0.2
    budget = int((baseline + 120 * MiB) / (1 - margin))
    profile = profile_create(
        campaign=campaign, margin=margin, memory_budget=budget, max_batch_size=64, sample_size=24
    )

    # when
    assert profile_run(profile.pk) == "done"
    profile.refresh_from_db()

    # then: the typical texts fit at 64, the long ones only at a smaller size
    count_steps = [s for s in profile.steps if s["phase"] == "count"]
    assert max(s["batch_size"] for s in count_steps if s["fits"]) == 64
    chosen = profile.chosen_batch_size
    assert 1 <= chosen < 64, profile.steps
    heavy_at_chosen = [
        s for s in profile.steps if s["phase"] == "heaviest" and s["batch_size"] == chosen
    ]
    assert all(s["peak_reserved"] <= (1 - margin) * budget for s in heavy_at_chosen)
    # the size above the chosen one, on the heaviest, did not keep the margin
    failed_above = [
        s
        for s in profile.steps
        if s["phase"] == "heaviest" and s["batch_size"] > chosen and not s["fits"]
    ]
    assert failed_above, profile.steps
    # the heaviest it tried are the long texts — all of them but the holdout's
    long_units = campaign.units.filter(uid__startswith="long-", holdout=False)
    assert {t["uid"] for t in profile.heaviest_tried} >= set(
        long_units.values_list("uid", flat=True)
    )
    assert not campaign.units.filter(holdout=True, pk__in=profile.sample).exists()
    assert profile.leak["leak"] is False, profile.leak

    # and a full run at the chosen size never exceeds the budget
    version = setup.version_create(
        campaign=campaign, params={**campaign.current_version.params, "batch_size": chosen}
    )
    assert version.params["batch_size"] == chosen
    with StepMemory(cpu()) as memory:
        run_here(campaign)
    assert selectors.campaign_counts(campaign=campaign).succeeded == SHORT + LONG
    assert memory.peak_reserved <= budget, (memory.peak_reserved / MiB, budget / MiB)


def test_estimate_follows_the_corpus_distribution_not_the_sample_mean(
    project, skewed_corpus, output_root, run_here, catalog
):
    campaign = _campaign(project, skewed_corpus, batch_policy="length_grouped")
    profile = profile_create(campaign=campaign, max_batch_size=32, sample_size=24)
    assert profile_run(profile.pk) == "done"
    profile.refresh_from_db()
    estimate = profile.estimate
    assert estimate.units == SHORT + LONG
    # the sample over-represents long texts: its mean overstates the corpus
    assert estimate.hours_naive > 1.25 * estimate.hours_measured_device

    # the estimate priced the batches a real run at the profiled size makes: the
    # same count and the same padded tokens (how long they take on this machine
    # is a benchmark's question: bench/profile_device.py --run)
    setup.version_create(
        campaign=campaign,
        params={**campaign.current_version.params, "batch_size": profile.chosen_batch_size},
    )
    run_here(campaign)
    done = Batch.objects.filter(campaign=campaign, state=Batch.State.DONE)
    model = fit_throughput(profile.steps)
    priced = sum(model.batch_seconds(b.padded_tokens) for b in done)
    priced += model.per_item * estimate.units
    estimated = estimate.hours_measured_device * 3600
    assert priced == pytest.approx(estimated, rel=0.01)

    # the estimate ends in a rental plan with its reasons, projections labelled
    assert estimate.gpu_name and estimate.quantity and estimate.duration_days in (3, 7, 30)
    assert {p["kind"] for p in estimate.projections} == {"projection"}
    assert any("projection" in line for line in estimate.reasoning)
    assert [p["policy"] for p in profile.policies] == ["original", "length_grouped", "token_budget"]
    original, grouped, _ = profile.policies
    assert grouped["padded"] < original["padded"]


def test_a_profile_is_rerun_on_the_same_sample_and_its_own_parameters(
    project, skewed_corpus, output_root, catalog
):
    campaign = _campaign(project, skewed_corpus)
    first = profile_create(campaign=campaign, max_batch_size=4, sample_size=10)
    # the campaign moved on to other parameters since
    setup.version_create(campaign=campaign, params={"max_tokens": 128})
    assert campaign.current_version != first.version

    again = profile_rerun(profile=first)

    assert again.sample == first.sample and again.heavy == first.heavy
    assert again.version == first.version
    assert (again.margin, again.max_batch_size) == (first.margin, first.max_batch_size)
    assert again.state == Profile.State.QUEUED
    assert Profile.objects.filter(campaign=campaign).count() == 2


def test_the_report_shows_each_step_while_the_profile_still_measures(
    client, owner, project, skewed_corpus, output_root, catalog
):
    """A CPU profile takes minutes: its page shows the device, the sample and
    every batch measured so far, not just "Running", and keeps polling."""
    campaign = _campaign(project, skewed_corpus)
    profile = profile_create(campaign=campaign, max_batch_size=4, sample_size=10)
    client.force_login(owner)
    seen: list[tuple[int, bool, bool]] = []
    real_run = TextEmbeddingProcessor.run

    def run(self, items):
        # What a person polling the page sees as the next batch starts.
        html = client.get(
            reverse("campaign_profile", args=[campaign.name]),
            HTTP_HX_REQUEST="true",
            HTTP_HX_TARGET="profile-report",
        ).content.decode()
        seen.append(
            (html.count("<tr data-phase="), 'hx-trigger="every 2s"' in html, "CPU (" in html)
        )
        return real_run(self, items)

    with mock.patch.object(TextEmbeddingProcessor, "run", run):
        assert profile_run(profile.pk) == "done"
    profile.refresh_from_db()
    assert len(seen) == len(profile.steps) > 5
    assert [shown for shown, _, _ in seen] == list(range(len(seen)))
    assert all(polling and device for _, polling, device in seen)


def test_a_profile_whose_worker_went_silent_fails_and_keeps_what_it_measured(
    client, owner, campaign_for_sweeps
):
    campaign = campaign_for_sweeps
    now = timezone.now()
    long_ago = now - timedelta(seconds=settings.PROFILE_HEARTBEAT_SECONDS * 3 + 1)
    steps = [{"phase": "count", "batch_size": 1, "fits": True}] * 3

    def made(state, heartbeat_at, **fields):
        return Profile.objects.create(
            campaign=campaign,
            version=campaign.current_version,
            state=state,
            heartbeat_at=heartbeat_at,
            **fields,
        )

    silent = made(Profile.State.RUNNING, long_ago, steps=steps)
    beating = made(Profile.State.RUNNING, now)
    waiting = made(Profile.State.QUEUED, None)
    finished = made(Profile.State.DONE, long_ago)
    from_before_heartbeats = made(Profile.State.RUNNING, None)
    Profile.objects.filter(pk=from_before_heartbeats.pk).update(created_at=long_ago)

    assert sorted(profiles_fail_stale(now=now)) == sorted([silent.pk, from_before_heartbeats.pk])

    states = dict(Profile.objects.values_list("pk", "state"))
    assert states[silent.pk] == states[from_before_heartbeats.pk] == Profile.State.FAILED
    assert states[beating.pk] == Profile.State.RUNNING
    assert states[waiting.pk] == Profile.State.QUEUED
    assert states[finished.pk] == Profile.State.DONE
    silent.refresh_from_db()
    assert silent.steps == steps
    assert "stopped answering" in silent.error and "after 3 measured" in silent.error
    # its page says so, and stops polling
    Profile.objects.exclude(pk=silent.pk).delete()
    client.force_login(owner)
    page = client.get(
        reverse("campaign_profile", args=[campaign.name]),
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="profile-report",
    )
    assert page.status_code == 286
    html = page.content.decode()
    assert "stopped answering" in html and html.count("<tr data-phase=") == 3


@pytest.mark.django_db(transaction=True)  # the heartbeat's thread has its own connection
def test_the_heartbeat_beats_through_a_long_step_and_the_sweeper_leaves_it_running(
    project, skewed_corpus, output_root, catalog, settings
):
    settings.PROFILE_HEARTBEAT_SECONDS = 0.2
    campaign = _campaign(project, skewed_corpus)
    profile = profile_create(campaign=campaign, max_batch_size=2, sample_size=6)
    real_run = TextEmbeddingProcessor.run
    swept: list[list[int]] = []

    def slow_run(self, items):
        time.sleep(1.0)  # a step five heartbeats long, as a CPU's large batch
        swept.append(profiles_fail_stale())
        return real_run(self, items)

    with mock.patch.object(TextEmbeddingProcessor, "run", slow_run):
        assert profile_run(profile.pk) == "done"
    assert swept and all(found == [] for found in swept)


def test_a_profile_the_sweeper_failed_meanwhile_stays_failed(
    project, skewed_corpus, output_root, catalog
):
    campaign = _campaign(project, skewed_corpus)
    profile = profile_create(campaign=campaign, max_batch_size=2, sample_size=6)
    real_run = TextEmbeddingProcessor.run

    def run_while_declared_dead(self, items):
        # The worker stalled long enough for the sweeper to give up on it.
        Profile.objects.filter(pk=profile.pk).update(state=Profile.State.FAILED, error="silent")
        return real_run(self, items)

    with mock.patch.object(TextEmbeddingProcessor, "run", run_while_declared_dead):
        assert profile_run(profile.pk) == "lost"
    profile.refresh_from_db()
    assert (profile.state, profile.error) == (Profile.State.FAILED, "silent")
    assert profile.chosen_batch_size is None


def test_a_profile_whose_model_fails_says_why_and_keeps_what_it_measured(
    project, skewed_corpus, output_root, catalog
):
    campaign = _campaign(project, skewed_corpus)
    profile = profile_create(campaign=campaign, max_batch_size=8, sample_size=6)
    real_run = TextEmbeddingProcessor.run
    calls: list[int] = []

    def run_then_break(self, items):
        calls.append(len(items))
        if len(calls) == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_run(self, items)

    with mock.patch.object(TextEmbeddingProcessor, "run", run_then_break):
        assert profile_run(profile.pk) == "failed"
    profile.refresh_from_db()
    assert profile.state == Profile.State.FAILED and profile.finished_at is not None
    assert profile.error == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert [s["batch_size"] for s in profile.steps] == [1, 2]  # measured before it broke
    assert profile.sample and profile.device.startswith("CPU") and profile.memory_budget


def test_a_profile_the_sweeper_failed_during_its_estimate_is_not_marked_done(
    project, skewed_corpus, output_root, catalog
):
    campaign = _campaign(project, skewed_corpus)
    profile = profile_create(campaign=campaign, max_batch_size=2, sample_size=6)
    real_estimate = estimates.estimate_build

    def estimate_while_declared_dead(**kwargs):
        Profile.objects.filter(pk=profile.pk).update(state=Profile.State.FAILED, error="silent")
        return real_estimate(**kwargs)

    with mock.patch.object(estimates, "estimate_build", estimate_while_declared_dead):
        assert profile_run(profile.pk) == "lost"
    profile.refresh_from_db()
    assert (profile.state, profile.error) == (Profile.State.FAILED, "silent")


# --- the sample's hard inputs ----------------------------------------------------


def test_inputs_a_run_failed_for_memory_time_or_the_model_are_heaviest_candidates(
    project, skewed_corpus
):
    # given: short (light) texts a run failed on, for each reason
    campaign = _campaign(project, skewed_corpus)
    shorts = list(campaign.units.filter(uid__startswith="short-", holdout=False).order_by("pk"))
    failed = {
        ErrorClass.OUT_OF_MEMORY: shorts[0],
        ErrorClass.TIMEOUT: shorts[1],
        ErrorClass.PROCESSING_ERROR: shorts[2],
        ErrorClass.INPUT_INVALID: shorts[3],
    }
    for error_class, unit in failed.items():
        Unit.objects.filter(pk=unit.pk).update(state=UnitState.FAILED, error_class=error_class)

    # when: a sample with room for only two of the (long) heaviest
    sample, heaviest = sample_build(campaign=campaign, size=2, heavy=2)

    # then: the run failures are heaviest candidates whatever their cost; the
    # bad input is in the sample (it must fail cleanly), not among the heaviest
    run_failures = {failed[c].pk for c in RUN_FAILURES}
    assert run_failures <= set(heaviest) <= set(sample)
    assert failed[ErrorClass.INPUT_INVALID].pk in set(sample) - set(heaviest)
    assert len(set(heaviest) - run_failures) == 2


def test_the_sample_holds_the_longest_and_the_shortest_texts(project, tmp_path):
    # given: texts all over max_tokens tie in cost; only their bytes tell the longest
    root = tmp_path / "lengths"
    root.mkdir()
    for i in range(30):
        (root / f"mid-{i:02d}.txt").write_text(" ".join(f"w{i}x{j}" for j in range(300)))
    (root / "zz-longest.txt").write_text(" ".join(f"long{j}" for j in range(3000)))
    (root / "zz-shortest.txt").write_text("ok")
    campaign = _campaign(project, root, name="lengths", max_tokens=64)
    campaign.units.update(holdout=False)

    sample, heaviest = sample_build(campaign=campaign, size=2, heavy=1)

    uids = set(campaign.units.filter(pk__in=sample).values_list("uid", flat=True))
    assert {"zz-longest.txt", "zz-shortest.txt"} <= uids
    assert len(sample) <= 2 + 1 + 2 * 3  # the random ones, the heaviest, the extremes


@pytest.fixture
def odd_images(tmp_path):
    """Ordinary photos, one large one, and strips no cost ranking would pick."""
    root = tmp_path / "images"
    root.mkdir()
    for i in range(16):
        Image.new("RGB", (64, 48), (i * 10, 90, 90)).save(root / f"photo-{i:02d}.png")
    Image.new("RGB", (400, 300), (10, 10, 10)).save(root / "large.png")
    # about the pixels of a photo: the same cost bucket, an extreme shape
    Image.new("RGB", (400, 8), (200, 0, 0)).save(root / "strip-wide.png")
    Image.new("RGB", (8, 380), (0, 200, 0)).save(root / "strip-tall.png")
    return root


def test_images_of_extreme_aspect_are_sampled_and_run_in_batches_of_their_own(
    project, odd_images, output_root, catalog
):
    campaign, _ = setup.campaign_create(
        name="odd-images",
        processor="image-transform",
        project=project,
        input_folder=odd_images,
        params={"operation": "thumbnail", "width": 32, "height": 32},
    )
    campaign.units.update(holdout=False)
    by_uid = dict(campaign.units.values_list("uid", "pk"))

    # the sample: the extremes of shape, whatever the random draw
    sample, heaviest = sample_build(campaign=campaign, size=2, heavy=1)
    assert {by_uid["strip-wide.png"], by_uid["strip-tall.png"]} <= set(sample)
    assert heaviest == [by_uid["large.png"]]
    kinds = unusual_units(campaign=campaign, units=campaign.units.filter(pk__in=sample), each=1)
    assert kinds["widest"] == [by_uid["strip-wide.png"]]
    assert kinds["tallest"] == [by_uid["strip-tall.png"]]

    # a manifest's width and height count without reading the file
    photo = campaign.units.get(uid="photo-03.png")
    photo.metadata = {"width": "4000", "height": "40"}
    photo.save(update_fields=["metadata"])
    kinds = unusual_units(campaign=campaign, units=campaign.units.all(), each=1)
    assert kinds["widest"] == [photo.pk]
    photo.metadata = {}
    photo.save(update_fields=["metadata"])

    # the profile runs each shape at the chosen size, and lists it with why
    profile = profile_create(
        campaign=campaign, max_batch_size=4, sample_size=2, heavy=1, memory_budget=32 * 1024 * MiB
    )
    assert profile_run(profile.pk) == "done", profile.error
    profile.refresh_from_db()
    unusual = {s["kind"]: s for s in profile.steps if s["phase"] == "unusual"}
    assert {"widest", "tallest"} <= set(unusual)
    assert unusual["widest"]["batch_size"] == profile.chosen_batch_size
    why = {row["uid"]: row["why"] for row in profile.heaviest_tried}
    assert why["strip-wide.png"] == "widest" and why["strip-tall.png"] == "tallest"
    assert why["large.png"] == "heaviest"


# --- a processor whose pace and memory are known: tests/plugins/paced_text.py ---------


@pytest.fixture
def paced(settings):
    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.paced_text.SPEC"]
    processor_specs._registry.cache_clear()
    processors._load.cache_clear()
    yield
    paced_text.KEPT.clear()
    processor_specs._registry.cache_clear()
    processors._load.cache_clear()


def _texts(root, **counts_by_words):
    """{"name": (how many, words each)} as text files."""
    root.mkdir()
    for name, (count, words) in counts_by_words.items():
        for i in range(count):
            (root / f"{name}-{i:02d}.txt").write_text(
                " ".join(f"{name}{i}w{j}" for j in range(words)) + "\n"
            )
    return root


def _paced(project, root, name="paced", **params):
    campaign, _ = setup.campaign_create(
        name=name, processor="paced-text", project=project, input_folder=root, params=params
    )
    return campaign


GiB = 1024 * MiB


def test_the_estimate_matches_a_real_run_of_a_processor_with_a_known_pace(
    project, tmp_path, paced, output_root, run_here, catalog
):
    # given: 20 texts of 50 words and 4 of 100; a batch sleeps 5 ms + 1 ms per padded
    # word (few units: their reading and writing, disk-bound, stays a small part)
    root = _texts(tmp_path / "paced", medium=(20, 50), long=(4, 100))
    campaign = _paced(project, root, us_per_token=1000, ms_per_batch=5, batch_size=4)
    profile = profile_create(
        campaign=campaign, max_batch_size=4, sample_size=12, heavy=3, memory_budget=32 * GiB
    )
    assert profile_run(profile.pk) == "done", profile.error
    profile.refresh_from_db()
    estimate = profile.estimate
    assert profile.chosen_batch_size == estimate.batch_size == 4

    # when: the whole corpus runs at that size
    run_here(campaign)

    # then: the batches took what the estimate said, within 25%
    done = Batch.objects.filter(campaign=campaign, state=Batch.State.DONE)
    assert sum(b.size for b in done) == 24
    real = sum((b.finished_at - b.started_at).total_seconds() for b in done)
    estimated = estimate.hours_measured_device * 3600
    assert estimated == pytest.approx(real, rel=0.25), (estimated, real)
    # 5 batches of 4 × 50 words and one of 4 × 100: 1.43 s of sleep, most of the time
    assert real > 1.3
    # and the outputs on disk (the texts upper-cased): what the cost buckets said
    written = sum(campaign.units.values_list("output_size", flat=True))
    assert estimate.output_bytes == pytest.approx(written, rel=0.1)


def test_a_processor_that_raises_on_an_input_a_run_failed_on_leaves_it_out_of_the_profile(
    project, tmp_path, paced, output_root, catalog
):
    root = _texts(tmp_path / "texts", note=(10, 8), report=(3, 40))
    (root / "poison.txt").write_text("a text with the poison word\n")
    campaign = _paced(project, root, fail_on="poison")
    campaign.units.update(holdout=False)
    campaign.units.filter(uid="poison.txt").update(
        state=UnitState.FAILED, error_class=ErrorClass.PROCESSING_ERROR
    )
    profile = profile_create(
        campaign=campaign, max_batch_size=2, sample_size=4, heavy=2, memory_budget=32 * GiB
    )

    assert profile_run(profile.pk) == "done", profile.error
    profile.refresh_from_db()
    probe = [s for s in profile.steps if s["phase"] == "probe"]
    assert [s["kind"] for s in probe] == ["poison.txt"] and "poison" in probe[0]["error"]
    failure = next(f for f in profile.sample_failures if f["uid"] == "poison.txt")
    assert failure["error"].startswith("processing_error: RuntimeError")
    assert profile.chosen_batch_size == 2


# --- the leak check ------------------------------------------------------------------


def _leak_profile(project, tmp_path, **params):
    root = _texts(tmp_path / "leaky", note=(12, 6), report=(3, 30))
    campaign = _paced(project, root, **params)
    profile = profile_create(
        campaign=campaign, max_batch_size=2, sample_size=4, heavy=2, memory_budget=32 * GiB
    )
    assert profile_run(profile.pk) == "done", profile.error
    profile.refresh_from_db()
    return profile.leak


@pytest.mark.parametrize(("leak_mib", "every"), [(32, 1), (64, 2)])
def test_a_processor_that_keeps_its_batches_is_caught_and_its_growth_named(
    project, tmp_path, paced, output_root, catalog, leak_mib, every
):
    leak = _leak_profile(project, tmp_path, leak_mib=leak_mib, leak_every=every)

    assert leak["leak"] is True, leak
    per_batch = leak_mib / every
    assert 0.5 * per_batch * MiB < leak["growth_per_batch"] < 1.6 * per_batch * MiB, leak
    assert leak["message"].startswith("allocated memory grows by")
    assert "MiB per batch" in leak["message"]


def test_a_processor_that_keeps_nothing_raises_no_alarm(
    project, tmp_path, paced, output_root, catalog
):
    leak = _leak_profile(project, tmp_path)
    assert leak["leak"] is False, leak
    assert leak["message"] == "allocated memory comes back to its baseline after each batch"


@pytest.mark.parametrize(
    ("after", "leak", "words"),
    [
        # 500 MiB kept after the first batch, never given back
        ([1500, 1500, 1500, 1500], True, "stays 500 MiB above its baseline"),
        # 100 MiB lost every other batch: no two repeats in a row rise
        ([1000, 1100, 1100, 1200], True, "grows by 60.0 MiB per batch"),
        ([1100, 1100, 1200, 1200], True, "grows by 40.0 MiB per batch"),
        # a steady leak
        ([1040, 1080, 1120, 1160], True, "grows by 40.0 MiB per batch"),
        # noise, and a spike that comes back
        ([1003, 998, 1005, 1001], False, "comes back to its baseline"),
        ([1000, 1100, 1000, 1000], False, "comes back to its baseline"),
    ],
)
def test_the_leak_verdict_compares_every_repeat_with_the_baseline(after, leak, words):
    verdict = leak_verdict(
        1000 * MiB, [a * MiB for a in after], per_batch=8 * MiB, retained=48 * MiB
    )
    assert verdict["leak"] is leak
    assert words in verdict["message"]


# --- the estimate: memory tiers, projections, disk --------------------------------------


def _measured(campaign, *, device, chosen, peaks_gb, oom=(), margin=0.2, items_per_s=100.0):
    """A done profile as a GPU worker leaves it: heaviest steps at these peaks."""
    costs.measure_costs(campaign=campaign, params=campaign.current_version.params)
    units = list(campaign.units.order_by("-cost", "pk"))
    steps = []
    for size, peak in peaks_gb.items():
        failed = size in oom
        steps.append(
            {
                "phase": "heaviest",
                "batch_size": size,
                "compute_s": size / items_per_s,
                "prepare_s": 0.0001 * size,
                "write_s_per_item": 0.0001,
                "padded": size * 40,
                "real": size * 40,
                "peak_allocated": int(peak * GiB * 0.9),
                "peak_reserved": int(peak * GiB),
                "oom": failed,
                "fits": not failed and size <= chosen,
                "items_per_s": None if failed else items_per_s,
            }
        )
    profile = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.DONE,
        sample=[u.pk for u in units],
        heavy=[u.pk for u in units[:4]],
        margin=margin,
        memory_budget=141 * GiB,
        device=device,
        runtime={"torch": "2.13.0+cu130", "cuda": "13.0"},
        steps=steps,
        chosen_batch_size=chosen,
        chosen_peak_reserved=int(peaks_gb[chosen] * GiB),
    )
    estimates.estimate_build(profile=profile)
    profile.refresh_from_db()
    return profile


H200_PEAKS = {64: 15, 128: 30, 256: 60, 512: 110, 1024: 141}


def test_a_batch_no_tier_holds_is_said_and_the_plan_takes_a_smaller_one(make_campaign, catalog):
    campaign = make_campaign()
    profile = _measured(
        campaign, device="NVIDIA H200", chosen=512, peaks_gb=H200_PEAKS, oom=(1024,)
    )
    estimate = profile.estimate

    # 110 GB / 0.8 = 137.5 GB: more than 80, said, not rounded down to 80
    assert memory_tier(profile.chosen_peak_reserved, 0.2) is None
    memory = next(line for line in estimate.reasoning if line.startswith("memory:"))
    assert "more than the largest tier (80 GB)" in memory
    assert "no card tier fits at this batch" in memory
    tiers = {row["tier_gb"]: row["batch_size"] for row in tier_batches(profile)}
    assert tiers == {24: 64, 48: 128, 80: 256}
    # the plan runs the batch its cards hold, and says so
    assert estimate.batch_size in (64, 128, 256)
    assert estimate.memory_tier_gb == {64: 24, 128: 48, 256: 80}[estimate.batch_size]
    assert estimate.peak_memory == H200_PEAKS[estimate.batch_size] * GiB
    by_gpu = {row["gpu"]: row for row in estimate.projections}
    assert by_gpu["A100 SXM"]["batch_size"] == 256
    assert by_gpu["L4"]["batch_size"] == 64
    assert by_gpu[estimate.gpu_name]["batch_size"] == estimate.batch_size


def test_a_small_load_is_planned_on_small_cards_though_the_device_allowed_more(
    make_campaign, catalog
):
    # the H200 allowed batch 512 at 60 GB; batch 64 needs 5 GB
    campaign = make_campaign()
    peaks = {64: 5, 128: 10, 256: 30, 512: 60}
    profile = _measured(campaign, device="NVIDIA H200", chosen=512, peaks_gb=peaks)
    estimate = profile.estimate

    assert memory_tier(profile.chosen_peak_reserved, 0.2) == 80
    tiers = {row["tier_gb"]: row["batch_size"] for row in tier_batches(profile)}
    assert tiers == {24: 128, 48: 256, 80: 512}
    # every card is priced at its own tier's batch; the cheap 24 GB ones win
    assert all(row["hours"] is not None for row in estimate.projections)
    assert estimate.gpu_name == "L4" and estimate.batch_size == 128
    assert estimate.memory_tier_gb == 24


def test_projections_scale_the_compute_not_the_reading_and_writing(make_campaign, catalog):
    campaign = make_campaign()
    profile = _measured(campaign, device="NVIDIA A40", chosen=64, peaks_gb={64: 10})
    estimate = profile.estimate
    by_gpu = {row["gpu"]: row for row in estimate.projections}
    a40, a100 = by_gpu["A40"], by_gpu["A100 SXM"]
    assert a40["kind"] == "measured"
    assert a40["hours"] == pytest.approx(estimate.hours_measured_device)
    assert a40["io_hours"] > 0
    # the A100 computes 2.2 × faster; it reads and writes no faster
    assert a100["io_hours"] == pytest.approx(a40["io_hours"])
    assert a100["compute_hours"] == pytest.approx(a40["compute_hours"] / 2.2)
    assert a100["hours"] == pytest.approx(a40["compute_hours"] / 2.2 + a40["io_hours"])


@pytest.mark.parametrize(
    ("device", "setting", "relative", "said"),
    [
        ("NVIDIA A40", None, 1.0, "catalog figure of A40"),
        ("CPU (2 threads)", None, 0.03, "for a CPU"),
        # Not in the catalog: not a CPU's pace, which made an L4 look 25 × faster.
        ("NVIDIA H200", None, 1.0, "NVIDIA H200 is not in the catalog"),
        ("NVIDIA H200", 3.2, 3.2, "PROFILE_DEVICE_RELATIVE_THROUGHPUT"),
    ],
)
def test_an_unlisted_device_is_projected_from_a_figure_the_estimate_names(
    make_campaign, catalog, settings, device, setting, relative, said
):
    settings.PROFILE_DEVICE_RELATIVE_THROUGHPUT = setting
    estimate = _measured(make_campaign(), device=device, chosen=64, peaks_gb={64: 10}).estimate
    a100 = {row["gpu"]: row for row in estimate.projections}["A100 SXM"]
    measured_compute = estimate.hours_measured_device - a100["io_hours"]
    assert a100["compute_hours"] == pytest.approx(measured_compute * relative / 2.2)
    assert any(said in line for line in estimate.reasoning), estimate.reasoning


def test_the_disk_estimate_weighs_outputs_by_the_corpus_cost_buckets():
    # outputs grow with the input; the heaviest steps wrote only large ones
    steps = [
        {"phase": "heaviest", "output_bytes_per_item": 8000, "outputs": [[1000, 8000]] * 8},
        {"phase": "outputs", "outputs": [[10, 80], [12, 96], [100, 800], [1000, 8000]]},
    ]
    costs = [10] * 900 + [100] * 90 + [1000] * 10
    # 900 × 88 (bucket 3: 80 and 96) + 90 × 800 + 10 × 8000
    assert output_bytes_estimate(steps=steps, costs=costs) == 900 * 88 + 72_000 + 80_000
    # a bucket the sample had none of takes the nearest measured one's size
    assert output_bytes_estimate(steps=steps, costs=[20]) == 88
