"""Setting up a campaign in the browser, pausing, resuming, changing parameters."""

from __future__ import annotations

import tracemalloc
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from campaigns.models import Batch, Campaign, Unit, UnitState
from campaigns.runs import start
from tests.conftest import DEMO_BAD, DEMO_GOOD

pytestmark = pytest.mark.django_db
NEW = reverse("campaign_new")


@pytest.fixture
def roots(settings, corpus, allow_folder):
    """The corpus, a folder of owner's project acme inside CORPUS_ROOTS."""
    settings.CORPUS_ROOTS = [corpus.parent]
    allow_folder(corpus)
    return corpus


@pytest.fixture
def send():
    with mock.patch.object(start.celery_app, "send_task") as send:
        yield send


def _form(corpus, **extra):
    data = {
        "project": "acme",
        "name": "web-made",
        "processor": "text-embedding",
        "folder": str(corpus),
    }
    from campaigns.specs.builtin import TEXT_EMBEDDING

    data.update({f"param_{k}": v for k, v in TEXT_EMBEDDING.clean({}).items()})
    data.update(extra)
    return data


def test_the_form_offers_allowed_folders_and_the_processor_parameters(client, owner, roots):
    client.force_login(owner)
    html = client.get(NEW).content.decode()
    assert f'value="{roots}"' in html
    assert f'value="{roots / "news"}"' in html
    assert 'name="param_max_tokens"' in html and 'value="256"' in html
    assert "tokens per text the model sees" in html


def test_the_form_offers_the_fast_batching_and_a_campaign_made_as_offered_takes_it(
    client, owner, roots, send
):
    # The default is the fast path (bench/RESULTS.md, "The defaults are the
    # fast path"): the page pre-selects it, and a form posted as the page
    # filled it, or with the parameter fields left out, makes a campaign with it.
    client.force_login(owner)
    html = client.get(NEW).content.decode()
    policy = html.split('name="param_batch_policy"')[1].split("</select>")[0]
    assert '<option value="token_budget" selected>' in policy
    assert 'value="4096"' in html.split('name="param_token_budget"')[1].split(">")[0]
    form = _form(roots, action="create")
    assert client.post(NEW, form).status_code == 302
    bare = {
        k: v for k, v in _form(roots, action="create", name="bare").items() if "param_" not in k
    }
    assert client.post(NEW, bare).status_code == 302
    for name in ("web-made", "bare"):
        params = Campaign.objects.get(name=name).current_version.params
        assert (params["batch_policy"], params["token_budget"]) == ("token_budget", 4096)


def test_choosing_another_processor_swaps_only_the_parameters(client, owner, roots):
    client.force_login(owner)
    response = client.get(
        NEW, {"processor": "image-transform"}, headers={"HX-Request": "true", "HX-Target": "params"}
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<fieldset id="params">')
    assert 'name="param_operation"' in html and "param_max_tokens" not in html


def test_preview_shows_first_units_and_failing_inputs_and_creates_nothing(
    client, owner, roots, send
):
    client.force_login(owner)
    html = client.post(NEW, _form(roots, action="preview")).content.decode()
    assert f"{DEMO_GOOD + DEMO_BAD} inputs" in html
    failing = html.split('class="grid failing"')[1].split("</table>")[0]
    assert "bad/empty.txt" in failing and "empty file" in failing
    assert "not valid UTF-8" in failing and "news/" not in failing
    assert not Campaign.objects.exists() and not send.called


def test_create_imports_and_starts_the_campaign(
    client, owner, roots, send, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            NEW,
            _form(
                roots, action="create", param_batch_policy="length_grouped", param_batch_size="10"
            ),
        )
    campaign = Campaign.objects.get(name="web-made")
    assert response.status_code == 302
    assert campaign.project.members.filter(pk=owner.pk).exists()
    assert campaign.current_version.params["batch_size"] == 10
    assert Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count() == 39
    assert send.call_count == 4


def test_the_checkpoint_size_and_holdout_share_are_set_on_the_form(
    client, owner, roots, send, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    html = client.get(NEW).content.decode()
    assert 'name="checkpoint_after"' in html and 'name="holdout_share"' in html
    form = _form(roots, action="create", checkpoint_after="7", holdout_share="12.5")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(NEW, form)
    assert response.status_code == 302
    campaign = Campaign.objects.get(name="web-made")
    assert (campaign.checkpoint_after, campaign.holdout_share) == (7, 0.125)
    held = campaign.units.filter(holdout=True).count()
    # the first group: 7 units outside the holdout, and the holdout
    queued = campaign.units.filter(state=UnitState.QUEUED)
    assert queued.filter(holdout=False).count() == 7
    assert queued.filter(holdout=True).count() == held > 0


def test_left_blank_the_checkpoint_is_automatic_and_the_holdout_five_per_cent(
    client, owner, roots, send
):
    client.force_login(owner)
    form = _form(roots, action="create", checkpoint_after="", holdout_share="")
    assert client.post(NEW, form).status_code == 302
    campaign = Campaign.objects.get(name="web-made")
    assert (campaign.checkpoint_after, campaign.holdout_share) == (None, 0.05)


def test_a_checkpoint_of_zero_means_none_and_top_folders_can_be_left_out(
    client, owner, roots, send
):
    client.force_login(owner)
    form = _form(roots, action="create", checkpoint_after="0", no_folder_categories="on")
    assert client.post(NEW, form).status_code == 302
    campaign = Campaign.objects.get(name="web-made")
    assert campaign.checkpoint_after == 0
    assert set(campaign.units.values_list("category", flat=True)) == {""}


def test_a_folder_created_campaign_takes_its_top_folders_as_categories(client, owner, roots, send):
    client.force_login(owner)
    html = client.post(NEW, _form(roots, action="preview")).content.decode()
    assert "<td>news/harbour-reopens.txt</td><td>news</td>" in html
    assert client.post(NEW, _form(roots, action="create")).status_code == 302
    campaign = Campaign.objects.get(name="web-made")
    assert campaign.units.get(uid="news/rail-strike.txt").category == "news"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"checkpoint_after": "-1"}, "the checkpoint size is a whole number of units"),
        ({"checkpoint_after": "2.5"}, "the checkpoint size is a whole number of units"),
        ({"holdout_share": "100"}, "the holdout share is a percentage from 0 to below 100"),
        ({"holdout_share": "-3"}, "the holdout share is a percentage from 0 to below 100"),
        ({"holdout_share": "five"}, "the holdout share is a percentage from 0 to below 100"),
    ],
)
def test_a_bad_checkpoint_size_or_holdout_share_is_refused_with_what_it_should_be(
    client, owner, roots, send, fields, message
):
    client.force_login(owner)
    response = client.post(NEW, _form(roots, action="create", **fields))
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Campaign.objects.exists() and not send.called


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ({"folder": "/etc"}, "that folder is not one your projects may read"),
        ({"param_pooling": "median"}, "Select a valid choice"),
        ({"param_max_tokens": "999999"}, "less than or equal to 8192"),
        ({"name": "Bad Name"}, "Enter a valid"),
        ({"name": "new"}, "reserved word"),
    ],
)
def test_tampered_fields_are_refused_and_nothing_is_created(
    client, owner, roots, send, tamper, message
):
    client.force_login(owner)
    response = client.post(NEW, _form(roots, action="create", **tamper))
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Campaign.objects.exists() and not send.called


def test_someone_elses_project_cannot_be_used(client, outsider, roots, send):
    client.force_login(outsider)  # acme is owner's, not outsider's
    response = client.post(NEW, _form(roots, action="create"))
    assert response.status_code == 400
    assert "that project is not one of yours" in response.content.decode()
    assert not Campaign.objects.exists() and not send.called


def test_a_manifest_upload_is_size_capped_and_kept_between_preview_and_create(
    client, owner, roots, send, settings
):
    client.force_login(owner)
    body = b"id,path\nq,short/question.txt\nw,short/one-word.txt\n"
    settings.MANIFEST_UPLOAD_MAX_BYTES = 10
    big = client.post(
        NEW, _form(roots, action="preview", manifest=SimpleUploadedFile("m.csv", body))
    )
    assert "the limit is 10" in big.content.decode()
    settings.MANIFEST_UPLOAD_MAX_BYTES = 1000
    html = client.post(
        NEW, _form(roots, action="preview", manifest=SimpleUploadedFile("m.csv", body))
    ).content.decode()
    assert "2 inputs" in html
    token = html.split('name="manifest_token" value="')[1].split('"')[0]
    client.post(NEW, _form(roots, action="create", manifest_token=token))
    assert sorted(Unit.objects.values_list("uid", flat=True)) == ["q", "w"]


def test_pause_takes_back_queued_batches_and_resume_queues_them_again(
    client, owner, make_campaign, send, django_capture_on_commit_callbacks
):
    campaign = make_campaign()
    with django_capture_on_commit_callbacks(execute=True):
        start.campaign_run(campaign=campaign)
    planned = Batch.objects.filter(campaign=campaign).count()
    client.force_login(owner)
    client.post(reverse("campaign_pause", args=[campaign.name]))
    assert Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count() == 39
    assert set(Batch.objects.values_list("state", flat=True)) == {"cancelled"}
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("campaign_resume", args=[campaign.name]), follow=True)
    assert f"{planned} batch{'es' if planned != 1 else ''} queued" in response.content.decode()
    assert Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count() == 39


def test_changing_parameters_after_a_run_makes_a_new_version_and_says_so(
    client, owner, make_campaign, send
):
    campaign = make_campaign()
    start.campaign_run(campaign=campaign)
    client.force_login(owner)
    url = reverse("campaign_params", args=[campaign.name])
    warning = client.get(url).content.decode().split('id="new-version-warning"')[1]
    assert "Every unit runs again under it, through its own checkpoint" in warning.split("</p>")[0]
    params = {f"param_{k}": v for k, v in campaign.current_version.params.items()}
    same = client.post(url, params, follow=True).content.decode()
    assert "Nothing changed" in same
    params["param_pooling"] = "cls"
    changed = client.post(url, params, follow=True).content.decode()
    campaign.refresh_from_db()
    assert campaign.current_version.number == 2
    assert campaign.current_version.params["pooling"] == "cls"
    assert f"New parameter version {campaign.current_version.label}" in changed


def test_a_model_folder_that_is_not_there_is_refused_on_the_form_not_by_a_batch(
    client, owner, roots, make_campaign, tmp_path, send
):
    client.force_login(owner)
    missing = tmp_path / "my-encoder"
    form = _form(roots, param_model=str(missing))
    for action in ({"preview": "1"}, {}):
        response = client.post(NEW, {**form, **action})
        assert response.status_code == 400
        assert f"model: cannot read {missing}" in response.content.decode()
    assert not Campaign.objects.filter(name="web-made").exists()
    assert not send.called

    campaign = make_campaign()
    url = reverse("campaign_params", args=[campaign.name])
    params = {f"param_{k}": v for k, v in campaign.current_version.params.items()}
    response = client.post(url, {**params, "param_model": str(missing)})
    assert response.status_code == 400
    assert f"model: cannot read {missing}" in response.content.decode()
    campaign.refresh_from_db()
    assert campaign.versions.count() == 1


# --- parameters the processor does not have ---------------------------------


@pytest.mark.parametrize("params_for", ["text-embedding", "no-such-processor", None])
def test_an_unknown_parameter_is_refused_as_the_command_line_refuses_it(
    client, owner, roots, send, params_for
):
    # given a typo'd (or tampered) parameter field, the form's processor named or not
    form = _form(roots, action="create", param_poolng="cls")
    if params_for is not None:
        form["params_for"] = params_for
    client.force_login(owner)
    # when
    response = client.post(NEW, form)
    # then
    assert response.status_code == 400
    html = response.content.decode()
    assert "unknown parameter(s) for text-embedding: poolng; known: batch_policy" in html
    assert not Campaign.objects.exists() and not send.called


def test_the_form_names_the_processor_its_parameter_fields_belong_to(client, owner, roots):
    client.force_login(owner)
    assert 'name="params_for" value="text-embedding"' in client.get(NEW).content.decode()
    swapped = client.get(
        NEW, {"processor": "image-transform"}, headers={"HX-Request": "true", "HX-Target": "params"}
    ).content.decode()
    # Inside the swapped fieldset: htmx replaces it together with the fields.
    assert 'name="params_for" value="image-transform"' in swapped.split("</fieldset>")[0]


@pytest.mark.parametrize("action", ["create", "preview"])
def test_switching_processor_without_javascript_resets_the_parameters_and_creates_nothing(
    client, owner, roots, send, action
):
    # given a form posted with the text-embedding fields but image-transform chosen
    form = _form(roots, action=action, processor="image-transform", params_for="text-embedding")
    client.force_login(owner)
    # when
    response = client.post(NEW, form)
    # then the form comes back with image-transform's fields at their defaults
    html = response.content.decode()
    assert response.status_code == 200
    assert "The parameters were reset to the defaults of" in html
    assert 'name="params_for" value="image-transform"' in html
    assert 'name="param_operation"' in html and "param_max_tokens" not in html
    assert 'name="param_width" value="256"' in html
    assert 'value="web-made"' in html  # what the user typed is kept
    assert 'id="preview"' not in html
    assert not Campaign.objects.exists() and not send.called


def test_the_parameters_page_refuses_an_unknown_parameter(client, owner, make_campaign, send):
    campaign = make_campaign()
    client.force_login(owner)
    url = reverse("campaign_params", args=[campaign.name])
    params = {f"param_{k}": v for k, v in campaign.current_version.params.items()}
    response = client.post(url, {**params, "param_pooling": "cls", "param_poolng": "cls"})
    assert response.status_code == 400
    assert "unknown parameter(s) for text-embedding: poolng" in response.content.decode()
    campaign.refresh_from_db()
    assert campaign.versions.count() == 1


# --- manifest uploads: capped as they arrive, not kept forever --------------


@pytest.fixture
def spooled(monkeypatch):
    """Bytes of uploads that Django's own handlers kept, in memory or on disk."""
    from django.core.files import uploadhandler

    received = {"bytes": 0}
    for cls in (uploadhandler.MemoryFileUploadHandler, uploadhandler.TemporaryFileUploadHandler):
        original = cls.receive_data_chunk

        def counting(self, raw_data, start, original=original):
            received["bytes"] += len(raw_data)
            return original(self, raw_data, start)

        monkeypatch.setattr(cls, "receive_data_chunk", counting)
    return received


@pytest.mark.parametrize("action", ["create", "preview"])
def test_an_oversized_manifest_is_stopped_as_it_arrives_and_nothing_is_created(
    client, owner, roots, send, settings, tmp_path, spooled, action
):
    # given a cap of 1,000 bytes and a 300 kB manifest
    settings.VAR_DIR = tmp_path
    settings.MANIFEST_UPLOAD_MAX_BYTES = 1000
    body = b"id,path\n" + b"q,short/question.txt\n" * 15_000
    client.force_login(owner)
    # when
    response = client.post(
        NEW, _form(roots, action=action, manifest=SimpleUploadedFile("m.csv", body))
    )
    # then
    html = response.content.decode()
    assert response.status_code == 400
    assert spooled["bytes"] <= 1000
    assert "manifest too large: the limit is 1,000 bytes" in html
    assert 'value="web-made"' in html  # the fields after the file were still read
    assert not (tmp_path / "manifests").exists() or not any((tmp_path / "manifests").iterdir())
    assert not Campaign.objects.exists() and not send.called


def _stored(folder, name, *, age_hours):
    import os
    import time

    path = folder / name
    path.write_text("id,path\n")
    then = time.time() - age_hours * 3600
    os.utime(path, (then, then))
    return path


def test_a_new_preview_manifest_removes_stored_ones_older_than_a_day(
    client, owner, roots, settings, tmp_path
):
    # given a manifest stored two days ago and one an hour ago
    settings.VAR_DIR = tmp_path
    folder = tmp_path / "manifests"
    folder.mkdir()
    old = _stored(folder, "a" * 32 + ".csv", age_hours=48)
    recent = _stored(folder, "b" * 32 + ".csv", age_hours=1)
    client.force_login(owner)
    # when a preview stores another
    body = b"id,path\nq,short/question.txt\n"
    html = client.post(
        NEW, _form(roots, action="preview", manifest=SimpleUploadedFile("m.csv", body))
    ).content.decode()
    # then
    token = html.split('name="manifest_token" value="')[1].split('"')[0]
    assert sorted(p.name for p in folder.iterdir()) == sorted([recent.name, token])
    assert not old.exists()


def test_create_with_a_preview_manifest_no_longer_kept_asks_for_it_again(
    client, owner, roots, send, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    client.force_login(owner)
    response = client.post(NEW, _form(roots, action="create", manifest_token="c" * 32 + ".csv"))
    assert response.status_code == 400
    assert "no longer kept" in response.content.decode()
    # Not the whole folder imported in the manifest's stead.
    assert not Campaign.objects.exists() and not send.called


def test_the_setup_form_still_needs_its_csrf_token(owner, roots, send):
    # The view is csrf_exempt for its upload handler and checks the token itself.
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post(NEW, _form(roots, action="create"))
    assert response.status_code == 403
    assert not Campaign.objects.exists() and not send.called


def test_create_and_start_of_an_adaptation_campaign_starts_its_training(
    client, owner, roots, tmp_path, settings, allow_folder, django_capture_on_commit_callbacks
):
    # given: a folder of example pairs in an allowed root
    import json

    from campaigns.models import Training
    from campaigns.specs.adaptation import TEXT_ADAPTATION

    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for i in range(8):
        (pairs / f"p{i}.json").write_text(json.dumps({"anchor": f"q {i}", "positive": f"a {i}"}))
    settings.CORPUS_ROOTS = [tmp_path]
    allow_folder(pairs)
    form = {
        "project": "acme",
        "name": "web-tuned",
        "processor": "text-adaptation",
        "folder": str(pairs),
        "action": "create",
        **{f"param_{k}": v for k, v in TEXT_ADAPTATION.clean({}).items()},
    }
    client.force_login(owner)

    # when
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(NEW, form)

    # then: its training is queued and the user lands on the training page
    campaign = Campaign.objects.get(name="web-tuned")
    assert response.status_code == 302
    assert response.url == reverse("training_page", args=[campaign.name])
    assert Training.objects.get(campaign=campaign).state == Training.State.QUEUED
    assert send.call_count == 1
    assert Unit.objects.filter(campaign=campaign).count() == 8


def test_the_setup_pages_check_reads_only_what_the_model_uses_of_a_huge_text(
    client, owner, roots, send
):
    # given: a 24 MB text among the inputs the page checks
    line = b"the harbour reopened on monday after three weeks of repairs " * 40 + b"\n"
    (roots / "a-huge.txt").write_bytes(line * (24 * 2**20 // len(line) + 1))
    client.force_login(owner)
    form = _form(roots, action="preview", param_max_tokens="16")
    client.post(NEW, form)  # once untraced: templates compiled, imports made
    # when: the preview is asked, traced
    tracemalloc.start()
    try:
        html = client.post(NEW, form).content.decode()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # then: the huge text is listed and not failing, and far less than its
    # file was allocated (its first max_tokens × 256 bytes were read)
    assert "a-huge.txt" in html
    assert "a-huge.txt" not in html.split('class="grid failing"')[1].split("</table>")[0]
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB allocated"
