"""Every campaign page, for every registered processor, in every state a campaign passes through.

A campaign of each processor in the registry (the built-ins, the adaptation processors and the
documented example plugin tests/plugins/text_stats.py) is walked through its life, and at each
step every page it has is requested: the campaign list; the campaign page and its htmx
fragments; the parameters, profile (two compared), unit, checkpoint, review-queue (its item
pane) and training pages; the versions page, with and without a comparison; and every file the
pages offer for download, with each version's matrix and rows. Each answers 200 (a polled
fragment 286 once idle; a version with nothing to download a 404 that says so) and shows what
the user looks for there: the campaign's name, its counts, failures, versions, checkpoint.

A campaign that runs batches is created; runs its first group to its checkpoint; has the spot
check decided and the rest run, with failures of several classes (bad inputs, a rejection in
review, a unit too big for memory even alone, a batch whose model raised, both through the
runner's own paths), and is profiled twice; gets a second parameter version run to that
version's checkpoint; and has that checkpoint failed. The model runs in this process on small
corpora (tests/conftest.py, `run_here`). An adaptation campaign trains instead and never stops
at a spot check: it is created; trained here and profiled; given a second version whose
training fails; and its checkpoint is made the model of a campaign of the matching kind, whose
pages then say where their model comes from.

A processor added to the registry is covered once FACTORIES says what its campaign imports:
until then test_every_registered_processor_has_inputs_here fails, naming it.
"""

from __future__ import annotations

import csv
import gc
import html
import io
import json
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from django.conf import settings
from django.db.models import Count
from django.test import override_settings
from django.urls import reverse

from campaigns.adaptation import services as adaptation
from campaigns.models import (
    Batch,
    Campaign,
    Checkpoint,
    ModelCheckpoint,
    Profile,
    ReviewItem,
    Training,
    Unit,
    UnitState,
)
from campaigns.profiles.services import profile_create, profile_rerun
from campaigns.review import queue as review
from campaigns.runs import setup, start
from campaigns.specs import processors as processor_specs
from campaigns.web.training_views import TARGET_PROCESSOR
from campaigns.web.version_views import downloads_of
from gpuworker.profiler import profile_run
from gpuworker.runner import run as model_run
from gpuworker.training_tasks import run_training
from tests.audio import bad_clips, encoded, tone
from tests.conftest import DEMO_CORPUS
from tests.generation import tiny_causal_lm
from tests.gpuworker.test_image_classification import (
    CLASSES,
    TinyCNN,
    classifier_params,
    shape_image,
)
from tests.speech import tiny_whisper

PLUGIN = "tests.plugins.text_stats.SPEC"


def _registered() -> list[str]:
    """The registry's processors, the example plugin registered as its guide says."""
    plugins = [*getattr(settings, "BRIEFGPU_PROCESSORS", []), PLUGIN]
    with override_settings(BRIEFGPU_PROCESSORS=plugins):
        processor_specs._registry.cache_clear()
        try:
            return sorted(processor_specs.all_specs())
        finally:
            processor_specs._registry.cache_clear()


REGISTERED = _registered()


@pytest.fixture(autouse=True)
def plugin_registered(settings):
    settings.BRIEFGPU_PROCESSORS = [*getattr(settings, "BRIEFGPU_PROCESSORS", []), PLUGIN]
    processor_specs._registry.cache_clear()
    yield
    processor_specs._registry.cache_clear()


# --- what each processor's campaign imports ------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    folder: Path
    params: dict
    changed: dict  # what the second parameter version changes
    holdout_share: float = 0.25  # enough held out for the holdout report to show some


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """The inputs and the model every campaign of the module reads (none writes them)."""
    root = tmp_path_factory.mktemp("inputs")
    for folder in ("bad", "docs", "news", "reviews"):  # 4 texts that fail, 18 that do not
        shutil.copytree(DEMO_CORPUS / folder, root / "texts" / folder)
    rng = random.Random(0)
    for kind in CLASSES:
        (root / "shapes" / kind).mkdir(parents=True)
        for i in range(6):
            shape_image(kind, rng).save(root / "shapes" / kind / f"{i}.png")
    (root / "shapes" / "bad").mkdir()
    (root / "shapes" / "bad" / "notes.jpg").write_text("not a picture")
    good = (root / "shapes" / "circle" / "0.png").read_bytes()
    (root / "shapes" / "bad" / "cut.png").write_bytes(good[:200])
    (root / "pairs").mkdir()
    for i in range(8):
        pair = {"anchor": f"how many kettles in room {i}?", "positive": f"Room {i}: {i} kettles."}
        (root / "pairs" / f"pair-{i}.json").write_text(json.dumps(pair))
    (root / "pairs" / "broken.json").write_text('{"anchor": "no positive here"}')
    # Untrained: the pages need outputs of the model's shape, not good ones.
    torch.manual_seed(0)
    torch.jit.script(TinyCNN().eval()).save(str(root / "tiny.pt"))
    (root / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    tiny_causal_lm(root / "tiny-lm")
    tiny_whisper(root / "tiny-whisper")
    (root / "clips" / "bad").mkdir(parents=True)
    for i in range(8):
        clip = tone(0.5 + i / 8, rate=8000 * (1 + i % 2), channels=1 + i % 2, freq=220 + 40 * i)
        (root / "clips" / f"clip-{i}.wav").write_bytes(encoded(clip, 8000 * (1 + i % 2)))
    for name, (data, _) in list(bad_clips().items())[:3]:
        (root / "clips" / "bad" / name).write_bytes(data)
    return root


def _classifier(shared: Path, **extra) -> dict:
    return classifier_params((shared / "tiny.pt", shared / "labels.txt"), **extra)


# The untrained model is unsure of every image: with these flags on, its flag rules fail
# the checkpoint by themselves (a repeating defect) before anyone looks.
UNSURE_IS_FINE = {"flag_min_margin": 0.0, "flag_min_confidence": 0.0}

FACTORIES: dict[str, Callable[[Path], Inputs]] = {
    "text-embedding": lambda shared: Inputs(
        # Batches of 4 texts: the batch life below fails its first two batches.
        shared / "texts",
        {"batch_size": 4, "batch_policy": "length_grouped", "max_tokens": 64},
        {"pooling": "cls"},
    ),
    "image-transform": lambda shared: Inputs(
        shared / "shapes", {"batch_size": 3, "width": 24, "height": 24}, {"format": "webp"}
    ),
    "image-classification": lambda shared: Inputs(
        shared / "shapes",
        _classifier(shared, batch_size=3, top_k=2, **UNSURE_IS_FINE),
        {"top_k": 3},
    ),
    "text-generation": lambda shared: Inputs(
        shared / "texts",
        {"model": str(shared / "tiny-lm"), "batch_size": 4, "batch_policy": "length_grouped"}
        # A random model's texts run to max_new_tokens: that flag alone would
        # fail the checkpoint as a repeating defect before anyone looks.
        | {"max_new_tokens": 6, "flag_length": "no"},
        {"decoding": "sample", "seed": 1},
    ),
    "audio-transform": lambda shared: Inputs(
        shared / "clips",
        {"batch_size": 3, "format": "wav", "sample_rate": 8000},
        {"format": "flac"},
    ),
    "speech-to-text": lambda shared: Inputs(
        shared / "clips",
        {"model": str(shared / "tiny-whisper"), "batch_size": 3, "max_new_tokens": 8}
        # A random model transcribes little: "no words" alone would fail the checkpoint.
        | {"language": "en", "flag_empty": "no"},
        {"task": "translate"},
    ),
    "text-stats": lambda shared: Inputs(shared / "texts", {"batch_size": 4}, {"lowercase": "yes"}),
    # Nothing held out: its training measures no held-out loss, the base model's neither.
    "text-adaptation": lambda shared: Inputs(
        shared / "pairs",
        {"batch_size": 4, "checkpoint_every": 1, "max_tokens": 32},
        {"seed": 1},
        0.0,
    ),
    "image-adaptation": lambda shared: Inputs(
        shared / "shapes",
        _classifier(shared, batch_size=4, checkpoint_every=1, learning_rate=0.01),
        {"seed": 1},
    ),
}


def test_every_registered_processor_has_inputs_here():
    missing = sorted(set(REGISTERED) - set(FACTORIES))
    assert not missing, (
        f"no inputs for processor(s) {', '.join(missing)}: add a factory to FACTORIES in "
        f"{__name__} so that every page of its campaigns is rendered"
    )


# --- the pages -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    what: str
    url: str
    shows: tuple[str, ...] = ()  # texts the user must find on it
    htmx: str = ""  # the HX-Target of an htmx request; "" for a whole page
    row: str = ""  # the shown texts are in the table row holding this one
    download: bool = False
    rows: int | None = None  # a download's data rows, where the database says how many
    absent: str = ""  # what a download's 404 says when there is nothing ("": never a 404)


def _escaped(*texts: str) -> tuple[str, ...]:
    return tuple(html.escape(text) for text in texts)


def _counts(campaign: Campaign) -> dict[str, int]:
    """The unit counts from the units themselves (the pages read counters)."""
    units = Unit.objects.filter(campaign=campaign)
    by_state = dict(units.values_list("state").annotate(n=Count("pk")).order_by())
    return {**{s: by_state.get(s, 0) for s in UnitState.values}, "total": units.count()}


def _failed_classes(campaign: Campaign) -> set[str]:
    failed = Unit.objects.filter(campaign=campaign, state=UnitState.FAILED)
    return set(failed.values_list("error_class", flat=True))


def _campaign_pages(campaign: Campaign) -> list[Page]:
    name, counts = campaign.name, _counts(campaign)
    detail = reverse("campaign_detail", args=[name])
    cells = tuple(f'data-count="{state}">{n}<' for state, n in counts.items())
    errors = tuple(f'data-error="{c}"' for c in sorted(_failed_classes(campaign)))
    status = review.verification_status(campaign=campaign).status
    lineage = ('id="lineage"',) if adaptation.lineage(campaign.current_version) else ()
    newest = Batch.objects.filter(campaign=campaign, finished_at__isnull=False).last()
    batch = (f'data-batch="{newest.pk}"',) if newest else ("No batch finished yet.",)
    units = Unit.objects.filter(campaign=campaign).order_by("pk")
    failed = units.filter(state=UnitState.FAILED).first()
    return [
        Page(
            "campaign list",
            reverse("campaign_list"),
            (f">{name}</a>", f"<td>{counts['succeeded']}</td>", f"<td>{counts['failed']}</td>"),
            row=f">{name}</a>",
        ),
        Page("campaign page", detail, (f"<h1>{name}\n", *lineage, *cells, *errors)),
        Page("counts", detail, (*cells, *errors), htmx="counts"),
        Page("run panels", detail, (f'data-verification="{status}"', *batch), htmx="run-panels"),
        Page("unit table", detail, _escaped(units.first().uid), htmx="unit-table"),
        Page("unit rows", detail, _escaped(units.first().uid), htmx="unit-rows"),
        Page(
            "failed units",
            f"{detail}?state=failed",
            _escaped(failed.uid, failed.error_class) if failed else ("No units match",),
            htmx="unit-table",
        ),
        Page(
            "parameters",
            reverse("campaign_params", args=[name]),
            (f"Parameters of {name}", campaign.current_version.label),
        ),
    ]


def _version_pages(campaign: Campaign) -> list[Page]:
    name, url = campaign.name, reverse("campaign_versions", args=[campaign.name])
    versions = list(campaign.versions.order_by("number"))
    rows = tuple(f'data-version="{v.number}"' for v in versions)
    pages = [
        Page("versions", url, (f"Parameter versions of {name}", *rows)),
        Page("versions fragment", url, rows, htmx="versions"),
    ]
    if len(versions) > 1:
        compared = f"{url}?a={versions[0].number}&b={versions[1].number}"
        pages.append(Page("versions compared", compared, ("with a valid output under both",)))
    # Each version's matrix and rows, linked or not: a version with no output says so.
    for version in versions:
        for filename in downloads_of(campaign):
            pages.append(
                Page(
                    f"{version.label} {filename}",
                    reverse("version_download", args=[name, version.number, filename]),
                    download=True,
                    absent=f"{version.label} has no readable output yet.",
                )
            )
    return pages


def _profile_pages(campaign: Campaign) -> list[Page]:
    url = reverse("campaign_profile", args=[campaign.name])
    profiles = list(Profile.objects.filter(campaign=campaign).order_by("-pk"))
    latest = profiles[0] if profiles else None
    shows = (
        (f'data-state="{latest.state}"', f'data-chosen="{latest.chosen_batch_size}"')
        if latest
        else ('data-state="none"',)
    )
    pages = [
        Page("profile", url, (campaign.name, "Batch-size profile", *shows)),
        Page("profile report", url, shows, htmx="profile-report"),
    ]
    if len(profiles) > 1:
        compared = f"{url}?compare={profiles[1].pk}"
        pages.append(Page("profiles compared", compared, ('id="profile-compare"',)))
    return pages


def _review_pages(campaign: Campaign) -> list[Page]:
    name, queue = campaign.name, reverse("review_queue")
    items = ReviewItem.objects.filter(campaign=campaign).order_by("pk")
    held_out = Unit.objects.filter(campaign=campaign, holdout=True).count()
    open_items = items.filter(state=ReviewItem.State.OPEN).count()
    pages = [
        Page(
            "holdout", reverse("review_holdout", args=[name]), (f"<p>{held_out} unit",), "holdout"
        ),
        Page("review queue", f"{queue}?campaign={name}&state=all", (f"<h2>{items.count()} item",)),
        Page("open review items", f"{queue}?campaign={name}", (f"<h2>{open_items} item",)),
    ]
    if items:
        item = items[0]
        pages.append(
            Page(
                "review item",
                f"{queue}?campaign={name}&state=all&item={item.pk}",
                _escaped(item.unit.uid),
                htmx="review-item",
            )
        )
    for checkpoint in Checkpoint.objects.filter(campaign=campaign):
        pages.append(
            Page(
                f"checkpoint {checkpoint.pk}",
                reverse("checkpoint_detail", args=[checkpoint.pk]),
                (f"Checkpoint {checkpoint.pk} of {name}", f'data-state="{checkpoint.state}"')
                + _escaped(checkpoint.reason),
            )
        )
    return pages


def _unit_pages(campaign: Campaign) -> list[Page]:
    """A unit of each state, error class and holdout: each shows its input and output."""
    pages, seen = [], set()
    for unit in Unit.objects.filter(campaign=campaign).order_by("pk"):
        kind = (unit.state, unit.error_class, unit.holdout)
        if kind not in seen:
            seen.add(kind)
            pages.append(
                Page(
                    f"unit {unit.uid} ({unit.state} {unit.error_class})",
                    reverse("unit_detail", args=[campaign.name, unit.pk]),
                    _escaped(unit.uid, unit.error_message[:60]),
                )
            )
    return pages


def _training_pages(campaign: Campaign) -> list[Page]:
    if not adaptation.is_adaptation(campaign):
        return []
    training = Training.objects.filter(version=campaign.current_version).first()
    shows = (
        _escaped(training.get_state_display(), training.error)
        if training
        else ("Not trained yet.",)
    )
    url = reverse("training_page", args=[campaign.name])
    return [
        Page("training", url, (campaign.name, *shows)),
        Page("training fragment", url, shows, htmx="training"),
    ]


PAGES = (
    _campaign_pages,
    _version_pages,
    _profile_pages,
    _review_pages,
    _unit_pages,
    _training_pages,
)


def _linked_downloads(body: str, campaign: Campaign) -> list[Page]:
    """The files a page offers (links with `download`), each to fetch."""
    units = Unit.objects.filter(campaign=campaign)
    expected = {
        "manifest.csv": units.count(),
        "results.csv": units.count(),
        "errors.csv": units.filter(state=UnitState.FAILED).count(),
        "batches.csv": Batch.objects.filter(campaign=campaign).count(),
    }
    pages = []
    for link in body.split("<a ")[1:]:
        tag = link.split(">", 1)[0]
        if " download" in tag and 'href="' in tag:
            url = html.unescape(tag.split('href="', 1)[1].split('"', 1)[0])
            filename = url.rsplit("/", 1)[-1]
            rows = expected.get(filename) if "/export/" in url else None
            pages.append(Page(f"download {filename}", url, download=True, rows=rows))
    return pages


def _download_problem(page: Page, response, content: bytes) -> str | None:
    if response.status_code == 404 and page.absent:
        # Nothing to download is an answer, if the user is told why.
        return None if page.absent in content.decode() else f"404 without {page.absent!r}"
    if response.status_code != 200:
        return f"status {response.status_code}"
    if "attachment" not in response.get("Content-Disposition", ""):
        return "not served as a file"
    if page.url.endswith(".npy"):
        matrix = np.load(io.BytesIO(content), allow_pickle=False)
        rows = int(response["X-Matrix-Shape"].split(",")[0])
        return None if matrix.shape[0] == rows > 0 else f"{matrix.shape} matrix, {rows} rows said"
    if page.url.endswith(".json"):
        json.loads(content)
        return None
    if page.url.endswith(".parquet"):
        table = pq.read_table(io.BytesIO(content))
        return None if table.num_rows > 0 else "a table without rows"
    rows = list(csv.reader(io.StringIO(content.decode())))
    if not rows:
        return "empty, not even a header"
    if page.rows is not None and len(rows) - 1 != page.rows:
        return f"{len(rows) - 1} rows, expected {page.rows}"
    return None


def _visit(client, page: Page) -> tuple[str | None, str]:
    """(what is wrong with the page or None, its body)."""
    headers = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": page.htmx} if page.htmx else {}
    try:
        response = client.get(page.url, **headers)
        content = b"".join(response.streaming_content) if response.streaming else response.content
    except Exception as exc:  # the test client raises what a user gets as a 500
        return f"{type(exc).__name__}: {exc}", ""
    if page.download:
        return _download_problem(page, response, content), ""
    body = content.decode()
    # A polled fragment answers 286 once there is nothing more to poll for.
    if response.status_code not in ((200, 286) if page.htmx else (200,)):
        return f"status {response.status_code}", body
    if page.htmx and "<html" in body:
        return "the whole page, not the fragment", body
    shown = body
    if page.row and page.row in body:
        start = body.rfind("<tr", 0, body.index(page.row))
        shown = body[start : body.index("</tr>", start)]
    missing = [text for text in page.shows if text not in shown]
    return (f"does not show {missing}" if missing else None), body


def _every_page(client, campaign: Campaign, state: str) -> list[str]:
    """What is wrong with any page of the campaign, or any file they offer."""
    campaign.refresh_from_db()
    problems, offered = [], {}
    for page in (page for pages in PAGES for page in pages(campaign)):
        problem, body = _visit(client, page)
        problems.append((page, problem))
        for download in _linked_downloads(body, campaign):
            offered.setdefault(download.url, download)
    problems += [(download, _visit(client, download)[0]) for download in offered.values()]
    return [
        f"[{campaign.name}: {state}] {page.what} {page.url}: {problem}"
        for page, problem in problems
        if problem
    ]


# --- the life of a campaign ------------------------------------------------------------------

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.77 GiB total capacity)"


def _failing_model():
    """The runner's model call, raising as a device does: the first batch's call fails (a
    CUDA error: the batch fails `processing_error`), and the second batch runs out of memory
    while its first unit is in it (split until that unit fails `out_of_memory` alone)."""
    real = model_run.run_splitting
    seen: dict = {"batches": 0, "too_big": None}

    class Raising:
        def __init__(self, processor, exc):
            self._processor, self._exc = processor, exc

        def __getattr__(self, name):
            return getattr(self._processor, name)

        def run(self, items):
            raise self._exc

    def run_splitting(processor, ready, splits, *tried):
        uids = [outcome.unit.uid for outcome, _ in ready]
        if not splits:  # a batch's own call; its halves come with the split sizes
            seen["batches"] += 1
            if seen["batches"] == 1:
                error = RuntimeError("CUDA error: an illegal memory access was encountered")
                return real(Raising(processor, error), ready, splits, *tried)
            if seen["batches"] == 2:
                seen["too_big"] = uids[0]
        if seen["too_big"] in uids:
            processor = Raising(processor, torch.OutOfMemoryError(OOM))
        return real(processor, ready, splits, *tried)

    return mock.patch.object(model_run, "run_splitting", run_splitting)


def _profiled(campaign: Campaign) -> None:
    """Its batch size profiled in this process as `campaign profile` does, then the same
    sample again (the page's re-run, to compare the two)."""
    # The profiler collects garbage before each measure (honest baselines): frozen, the
    # test process's heap (torch, Django, the other tests) is not scanned each time.
    gc.freeze()
    try:
        profile = profile_create(campaign=campaign, max_batch_size=2, sample_size=6, heavy=2)
        for again in (False, True):
            profile = profile_rerun(profile=profile) if again else profile
            outcome = profile_run(profile.pk)
            profile.refresh_from_db()
            assert outcome == Profile.State.DONE, profile.error
    finally:
        gc.unfreeze()


def _checkpoint_of(campaign: Campaign, state: str) -> Checkpoint:
    campaign.refresh_from_db()
    checkpoint = Checkpoint.objects.get(campaign=campaign, version=campaign.current_version)
    assert checkpoint.state == state, (checkpoint.state, checkpoint.reason)
    return checkpoint


def _batch_life(campaign: Campaign, inputs: Inputs, run_here, owner) -> Iterator[str]:
    yield "created"

    run_here(campaign)
    checkpoint = _checkpoint_of(campaign, Checkpoint.State.PENDING)
    yield "at its checkpoint"

    accepted, rejected, *_ = checkpoint.items.order_by("pk")
    review.review_decide(item=accepted, decision="accepted", user=owner)
    review.review_decide(item=rejected, decision="rejected", user=owner, note="blurred")
    review.checkpoint_decide(checkpoint=checkpoint, passed=True, user=owner)
    with _failing_model():
        run_here(campaign)
    failed = _failed_classes(campaign)
    assert {"out_of_memory", "processing_error", "rejected_by_review"} <= failed, failed
    _profiled(campaign)
    yield "checkpoint passed, run to the end with failures, profiled"

    params = {**campaign.current_version.params, **inputs.changed}
    setup.version_create(campaign=campaign, params=params)
    campaign.refresh_from_db()
    run_here(campaign)
    second = _checkpoint_of(campaign, Checkpoint.State.PENDING)
    yield "second version at its checkpoint"

    review.checkpoint_decide(checkpoint=second, passed=False, user=owner, reason="too blurred")
    yield "second version's checkpoint failed"


def _train_here(campaign: Campaign, capture_on_commit) -> Training:
    """Start the training as the page does, and run the task it sends in this process."""
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        capture_on_commit(execute=True),
    ):
        training = adaptation.training_start(campaign=campaign)
    for call in send.call_args_list:
        run_training(*call.kwargs["args"])
    training.refresh_from_db()
    return training


def _training_life(
    campaign: Campaign, inputs: Inputs, project, shared: Path, capture_on_commit
) -> Iterator[str]:
    yield "created"

    training = _train_here(campaign, capture_on_commit)
    assert training.state == Training.State.DONE, training.error
    assert _failed_classes(campaign), "its bad examples fail"
    _profiled(campaign)
    yield "trained, profiled"

    params = {**campaign.current_version.params, **inputs.changed}
    setup.version_create(campaign=campaign, params=params)
    campaign.refresh_from_db()
    with mock.patch("gpuworker.training_tasks._train", side_effect=torch.OutOfMemoryError(OOM)):
        failed = _train_here(campaign, capture_on_commit)
    assert failed.state == Training.State.FAILED, failed.state
    yield "second version's training failed"

    kind = TARGET_PROCESSOR[campaign.processor]
    target_inputs = FACTORIES[kind](shared)
    target, _ = setup.campaign_create(
        name=f"{campaign.name}-target",
        processor=kind,
        project=project,
        input_folder=target_inputs.folder,
        params=target_inputs.params,
    )
    last = training.checkpoints.filter(state=ModelCheckpoint.State.KEPT).order_by("step").last()
    adaptation.checkpoint_use(checkpoint=last, target=target)
    yield "its checkpoint the model of another campaign"


@pytest.mark.parametrize("processor", REGISTERED)
def test_every_page_of_a_campaign_answers_in_every_state(
    processor,
    shared,
    client,
    owner,
    project,
    output_root,
    run_here,
    django_capture_on_commit_callbacks,
):
    if processor not in FACTORIES:
        pytest.fail(f"no inputs for processor {processor}: add a factory to FACTORIES")
    inputs = FACTORIES[processor](shared)
    campaign, _ = setup.campaign_create(
        name=processor,
        processor=processor,
        project=project,
        input_folder=inputs.folder,
        params=inputs.params,
        checkpoint_after=6,
        holdout_share=inputs.holdout_share,
    )
    client.force_login(owner)
    if processor_specs.get_spec(processor).training:
        capture = django_capture_on_commit_callbacks
        life = _training_life(campaign, inputs, project, shared, capture)
    else:
        life = _batch_life(campaign, inputs, run_here, owner)

    problems = []
    for state in life:
        for each in Campaign.objects.filter(project=project).order_by("pk"):
            problems += _every_page(client, each, state)

    assert not problems, "\n".join(problems)
