"""Setting up a campaign in the browser, pausing, resuming, changing parameters."""

from __future__ import annotations

from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from campaigns import services
from campaigns.models import Batch, Campaign, Unit, UnitState
from tests.conftest import DEMO_BAD, DEMO_GOOD, ProjectFactory

pytestmark = pytest.mark.django_db
NEW = reverse("campaign_new")


@pytest.fixture
def roots(settings, corpus):
    settings.CORPUS_ROOTS = [corpus.parent]
    return corpus


@pytest.fixture
def send():
    with mock.patch.object(services.celery_app, "send_task") as send:
        yield send


def _form(corpus, **extra):
    data = {
        "project": "acme",
        "name": "web-made",
        "processor": "text-embedding",
        "folder": str(corpus),
    }
    from campaigns.builtin_processors import TEXT_EMBEDDING

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
        response = client.post(NEW, _form(roots, action="create", param_batch_size="10"))
    campaign = Campaign.objects.get(name="web-made")
    assert response.status_code == 302
    assert campaign.project.members.filter(pk=owner.pk).exists()
    assert campaign.current_version.params["batch_size"] == 10
    assert Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count() == 39
    assert send.call_count == 4


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ({"folder": "/etc"}, "Select a valid choice"),
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
    ProjectFactory(name="acme")  # outsider is not a member
    client.force_login(outsider)
    response = client.post(NEW, _form(roots, action="create"))
    assert response.status_code == 400
    assert "belongs to someone else" in response.content.decode()


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
        services.campaign_run(campaign=campaign)
    client.force_login(owner)
    client.post(reverse("campaign_pause", args=[campaign.name]))
    assert Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count() == 39
    assert set(Batch.objects.values_list("state", flat=True)) == {"cancelled"}
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("campaign_resume", args=[campaign.name]), follow=True)
    assert "3 batches queued" in response.content.decode()
    assert Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count() == 39


def test_changing_parameters_after_a_run_makes_a_new_version_and_says_so(
    client, owner, make_campaign, send
):
    campaign = make_campaign()
    services.campaign_run(campaign=campaign)
    client.force_login(owner)
    url = reverse("campaign_params", args=[campaign.name])
    warning = client.get(url).content.decode().split('id="new-version-warning"')[1]
    assert "holdout units run again" in warning.split("</p>")[0]
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
