"""Parameters that only a worker used to find wrong are refused when the version is made."""

from __future__ import annotations

import json
import shutil

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.urls import reverse

from campaigns.models import Campaign
from campaigns.specs.builtin import (
    IMAGE_CLASSIFICATION,
    TEXT_EMBEDDING,
    resolve_model_path,
)

MINILM = resolve_model_path(TEXT_EMBEDDING.params["model"].default)


@pytest.fixture
def encoder(tmp_path):
    """A user's own encoder folder: a copy of the packaged one, to break."""
    folder = tmp_path / "my-encoder"
    shutil.copytree(MINILM, folder)
    return folder


def test_an_encoder_folder_without_its_tokenizer_file_is_refused_by_name(encoder):
    (encoder / "tokenizer.json").unlink()
    with pytest.raises(ValidationError, match=f"{encoder} has no tokenizer.json"):
        TEXT_EMBEDDING.clean({"model": str(encoder)})


def test_a_dimension_the_model_does_not_give_is_refused_with_the_right_one(encoder):
    with pytest.raises(ValidationError, match="gives 384-d vectors.*set dimension to 384"):
        TEXT_EMBEDDING.clean({"dimension": 768})
    config = json.loads((encoder / "config.json").read_text())
    config["hidden_size"] = 768
    (encoder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValidationError, match="gives 768-d vectors"):
        TEXT_EMBEDDING.clean({"model": str(encoder)})
    assert TEXT_EMBEDDING.clean({"model": str(encoder), "dimension": 768})["dimension"] == 768


@pytest.mark.django_db
def test_the_command_line_refuses_a_broken_encoder_before_creating_anything(encoder, corpus):
    (encoder / "tokenizer.json").unlink()
    with pytest.raises(CommandError, match="has no tokenizer.json"):
        call_command(
            "campaign",
            "create",
            "own-encoder",
            "--processor",
            "text-embedding",
            "--input",
            str(corpus),
            "--param",
            f"model={encoder}",
        )
    assert not Campaign.objects.exists()


@pytest.mark.parametrize(
    "given, said",
    [
        ({"mean": "abc"}, "mean must be three numbers"),
        ({"mean": "0.5,0.5"}, "mean must be three numbers"),
        ({"std": "0.2,nan,0.2"}, "std must be three numbers"),
        ({"std": "0.2,0,0.2"}, "std values must be above 0"),
    ],
)
def test_normalisation_values_the_worker_cannot_use_are_refused(given, said, tmp_path):
    params = {"model": str(tmp_path / "m.pt2"), "labels": str(tmp_path / "labels.txt"), **given}
    with pytest.raises(ValidationError, match=said):
        IMAGE_CLASSIFICATION.clean(params)


def test_a_fine_tuning_of_a_classifier_checks_its_parameters_as_the_classifier_does(tmp_path):
    from campaigns.specs.adaptation import IMAGE_ADAPTATION

    params = {"model": str(tmp_path / "m.pt2"), "labels": str(tmp_path / "labels.txt")}
    with pytest.raises(ValidationError, match="mean must be three numbers"):
        IMAGE_ADAPTATION.clean({**params, "mean": "abc"})
    with pytest.raises(ValidationError, match="unknown architecture 'vgg-ish'"):
        IMAGE_ADAPTATION.clean({**params, "architecture": "vgg-ish"})


def test_good_normalisation_values_pass(tmp_path):
    params = {"model": "m.pt2", "labels": "l.txt", "mean": "0.5, 0.5, 0.5", "std": "1,1,1"}
    assert IMAGE_CLASSIFICATION.clean(params)["mean"] == "0.5, 0.5, 0.5"


@pytest.mark.django_db
def test_the_preview_lists_texts_over_the_cap_when_truncation_refuses(
    client, owner, settings, corpus, allow_folder
):
    settings.CORPUS_ROOTS = [corpus.parent]
    allow_folder(corpus)
    client.force_login(owner)
    form = {
        "project": "acme",
        "name": "web-made",
        "processor": "text-embedding",
        "folder": str(corpus),
        "action": "preview",
    }
    params = TEXT_EMBEDDING.clean({"truncation": "refuse", "max_tokens": 512})
    form.update({f"param_{k}": v for k, v in params.items()})
    html = client.post(reverse("campaign_new"), form).content.decode()
    failing = html.split('class="grid failing"')[1].split("</table>")[0]
    assert "long/annual-report.txt" in failing
    assert "4123 tokens, over max_tokens 512 (truncation=refuse)" in failing
    assert "news/" not in failing  # texts under the cap are not listed
