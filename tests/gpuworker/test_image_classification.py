"""A tiny CNN trained here on generated shapes, loaded through the user's path."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from django.core.exceptions import ValidationError
from django.urls import reverse
from PIL import Image, ImageDraw

from campaigns.models import Attempt, Unit, UnitState
from campaigns.runs import control, setup, start
from campaigns.verify.reconcile import campaign_verify

CLASSES = ["circle", "square", "triangle"]
COLOURS = {"circle": (220, 40, 40), "square": (40, 200, 40), "triangle": (40, 40, 220)}
SIZE = 48


def shape_image(kind: str, rng: random.Random) -> Image.Image:
    background = tuple(rng.randint(0, 90) for _ in range(3))
    image = Image.new("RGB", (SIZE, SIZE), background)
    draw = ImageDraw.Draw(image)
    r = rng.randint(10, 18)
    cx, cy = rng.randint(r, SIZE - r), rng.randint(r, SIZE - r)
    colour = tuple(min(255, max(0, c + rng.randint(-30, 30))) for c in COLOURS[kind])
    if kind == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif kind == "square":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    return image


class TinyCNN(torch.nn.Module):
    def __init__(self, num_classes: int = len(CLASSES)):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
        )
        self.head = torch.nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return self.head(features), features


class TinyLogits(TinyCNN):
    """The same network as torchvision's classifiers are: logits alone, built
    from num_classes (registered below as an architecture a state dict fills)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _tensor(image: Image.Image) -> np.ndarray:
    return ((np.asarray(image, dtype=np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


@pytest.fixture(scope="module")
def user_model(tmp_path_factory) -> tuple[Path, Path]:
    """Trains in a few seconds; saved as TorchScript like a user's own file."""
    torch.manual_seed(0)
    rng = random.Random(0)
    model = TinyCNN()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for _step in range(120):
        kinds = [rng.randrange(3) for _ in range(32)]
        x = torch.from_numpy(np.stack([_tensor(shape_image(CLASSES[k], rng)) for k in kinds]))
        loss = torch.nn.functional.cross_entropy(model(x)[0], torch.tensor(kinds))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    folder = tmp_path_factory.mktemp("model")
    torch.jit.script(model.eval()).save(str(folder / "tiny.pt"))
    (folder / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    return folder / "tiny.pt", folder / "labels.txt"


@pytest.fixture
def shapes(tmp_path) -> Path:
    rng = random.Random(42)
    root = tmp_path / "shapes"
    for kind in CLASSES:
        (root / kind).mkdir(parents=True)
        for i in range(10):
            shape_image(kind, rng).save(root / kind / f"{i}.png")
    (root / "bad").mkdir()
    (root / "bad" / "notes.jpg").write_text("not a picture")
    good = root / "circle" / "0.png"
    (root / "bad" / "cut.png").write_bytes(good.read_bytes()[:200])
    return root


def classifier_params(trained: tuple[Path, Path], **extra) -> dict:
    """Parameters of an image-classification campaign over a tiny CNN of these tests."""
    model, labels = trained
    return {
        "model": str(model),
        "labels": str(labels),
        "resize": SIZE,
        "crop": SIZE,
        "mean": "0.5,0.5,0.5",
        "std": "0.5,0.5,0.5",
        **extra,
    }


def _params(user_model, **extra):
    return classifier_params(user_model, top_k=3, **extra)


def _classifier(name: str, project, folder: Path, params: dict):
    campaign, _ = setup.campaign_create(
        name=name,
        processor="image-classification",
        project=project,
        input_folder=folder,
        params=params,
    )
    return campaign


def _classified(user_model, shapes: Path, project, run_here):
    """The shapes classified by the tiny model, in batches of 8."""
    campaign = _classifier("shapes", project, shapes, _params(user_model, batch_size=8))
    run_here(campaign)
    return campaign


@pytest.mark.django_db
def test_a_user_torchscript_model_classifies_and_exports_features(
    user_model, shapes, project, output_root, run_here
):
    campaign = _classified(user_model, shapes, project, run_here)

    units = Unit.objects.filter(campaign=campaign)
    assert units.filter(state=UnitState.SUCCEEDED).count() == 30
    bad = {u.uid: u for u in units.filter(state=UnitState.FAILED)}
    assert set(bad) == {"bad/notes.jpg", "bad/cut.png"}
    assert "not an image" in bad["bad/notes.jpg"].error_message
    assert "truncated" in bad["bad/cut.png"].error_message

    right = 0
    for unit in units.filter(state=UnitState.SUCCEEDED):
        attempt = Attempt.objects.get(unit=unit)
        right += attempt.metrics["category"] == unit.uid.split("/")[0]
        with np.load(output_root / unit.output_path) as out:
            assert out["features"].shape == (16,)
            assert list(out["top_labels"])[0] == attempt.metrics["category"]
            assert 0.0 <= float(out["margin"]) <= 1.0
            assert np.isclose(out["top_probs"].sum(), 1.0, atol=1e-4)  # top 3 of 3 classes
    assert right >= 27, f"{right}/30 right: the tiny model or the preprocessing is off"
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["valid"] == 30 and report["input_invalid"] == 2


@pytest.mark.django_db
def test_a_unit_page_shows_the_image_beside_what_the_model_said(
    user_model, shapes, project, output_root, run_here, client, owner
):
    campaign = _classified(user_model, shapes, project, run_here)
    client.force_login(owner)

    def page(uid: str) -> str:
        unit = Unit.objects.get(campaign=campaign, uid=uid)
        return client.get(reverse("unit_detail", args=[campaign.name, unit.pk])).content.decode()

    square = Attempt.objects.get(unit__campaign=campaign, unit__uid="square/3.png").metrics
    html = page("square/3.png")
    assert 'id="input-thumbnail"' in html and 'src="data:image/png;base64,' in html
    ranked = re.findall(r"<tr><td>(\w+)</td><td>([\d.]+)</td></tr>", html)
    assert ranked[0][0] == square["category"]
    assert sorted(label for label, _ in ranked) == sorted(CLASSES)  # top 3 of 3
    assert float(ranked[0][1]) == pytest.approx(square["probability"], abs=1e-3)
    assert f"<strong data-margin>{square['margin']:.3f}</strong>" in html

    # An input the worker refused: the page says why, and shows no output.
    html = page("bad/notes.jpg")
    assert "Cannot show the input: input_invalid: not an image Pillow can read" in html
    assert 'id="output-error">not an image Pillow can read' in html


@pytest.mark.django_db
def test_a_labels_file_that_does_not_match_the_model_fails_the_batch_clearly(
    user_model, shapes, project, output_root, tmp_path, run_here
):
    labels = tmp_path / "two.txt"
    labels.write_text("circle\nsquare\n")
    params = _params(user_model)
    params["labels"] = str(labels)
    campaign = _classifier("mismatch", project, shapes / "circle", params)
    run_here(campaign)
    messages = set(Unit.objects.filter(campaign=campaign).values_list("error_message", flat=True))
    assert messages == {"ValueError: model gives 3 classes, labels file has 2"}


@pytest.mark.django_db
def test_model_and_labels_are_required(project, shapes):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="model is required"):
        setup.campaign_create(
            name="x", processor="image-classification", project=project, input_folder=shapes
        )


@pytest.mark.django_db
def test_a_torch_export_program_works_like_a_torchscript_file(
    user_model, shapes, project, output_root, tmp_path, run_here
):
    scripted = torch.jit.load(str(user_model[0]))
    model = TinyCNN()
    model.load_state_dict(scripted.state_dict())
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(
        model.eval(), (torch.zeros(2, 3, SIZE, SIZE),), dynamic_shapes=({0: batch},)
    )
    path = tmp_path / "tiny.pt2"
    torch.export.save(program, str(path))
    params = _params(user_model, batch_size=7)
    params["model"] = str(path)
    campaign, _ = setup.campaign_create(
        name="exported",
        processor="image-classification",
        project=project,
        input_folder=shapes / "square",
        params=params,
    )
    run_here(campaign)
    done = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
    assert done.count() == 10
    right = sum(Attempt.objects.get(unit=u).metrics["category"] == "square" for u in done)
    assert right >= 9


def test_versions_that_differ_in_a_flag_share_one_model_and_a_replaced_file_is_reloaded(
    user_model, tmp_path
):
    from campaigns.specs.builtin import IMAGE_CLASSIFICATION
    from gpuworker.processors import get_processor

    model_file, labels = tmp_path / "user.pt", user_model[1]
    model_file.write_bytes(user_model[0].read_bytes())
    first = get_processor(
        "image-classification", IMAGE_CLASSIFICATION.clean(_params((model_file, labels)))
    )
    flagged = get_processor(
        "image-classification",
        IMAGE_CLASSIFICATION.clean(_params((model_file, labels), flag_min_confidence=0.9)),
    )
    assert flagged is not first  # a processor per parameter version...
    assert flagged.model is first.model  # ...one copy of the weights in memory

    # The user saves another model over the file: a new version gets the new one.
    other = TinyCNN()
    torch.jit.script(other.eval()).save(str(model_file))
    replaced = get_processor(
        "image-classification",
        IMAGE_CLASSIFICATION.clean(_params((model_file, labels), flag_min_confidence=0.8)),
    )
    assert replaced.model is not first.model
    x = torch.from_numpy(_tensor(Image.new("RGB", (SIZE, SIZE), (200, 30, 30)))[None])
    assert torch.allclose(replaced.model(x)[0], other(x)[0])
    assert not torch.allclose(first.model(x)[0], other(x)[0])


@pytest.mark.django_db
def test_a_version_records_its_model_and_a_model_replaced_under_it_fails_clearly(
    user_model, shapes, project, output_root, tmp_path, run_here
):
    import hashlib
    from unittest import mock

    from django.core.exceptions import ValidationError

    from campaigns.models import Campaign, ParameterVersion

    model_file, labels = tmp_path / "user.pt", user_model[1]
    model_file.write_bytes(user_model[0].read_bytes())
    params = _params((model_file, labels))

    # A model path that is not there: refused before anything is made.
    with pytest.raises(ValidationError, match=r"model: cannot read .*/nowhere\.pt"):
        _classifier("typo", project, shapes, {**params, "model": str(tmp_path / "nowhere.pt")})
    assert not Campaign.objects.filter(name="typo").exists()

    campaign = _classifier("shapes", project, shapes / "circle", params)
    v1 = campaign.current_version
    files = v1.software["files"]
    assert files["model"] == {
        "path": str(model_file),
        "sha256": hashlib.sha256(model_file.read_bytes()).hexdigest(),
    }
    assert files["labels"]["sha256"] == hashlib.sha256(labels.read_bytes()).hexdigest()
    assert "weights" not in files  # left out: optional

    # The user saves another model over the file while the campaign waits.
    torch.jit.script(TinyCNN().eval()).save(str(model_file))
    run_here(campaign)
    units = Unit.objects.filter(campaign=campaign)
    assert set(units.values_list("state", flat=True)) == {UnitState.FAILED}
    message = units.first().error_message
    assert units.first().error_class == "processing_error"
    assert f"model {model_file} changed since this parameter version was made" in message
    assert "save the parameters again" in message
    assert not any(output_root.rglob("*.npz"))  # nothing written under v1's label

    # Saving the same parameters again is a new version, with the new model's digest.
    v2 = setup.version_create(campaign=campaign, params=params)
    assert v2.pk != v1.pk and ParameterVersion.objects.filter(campaign=campaign).count() == 2
    assert v2.software["files"]["model"]["sha256"] != files["model"]["sha256"]
    with mock.patch.object(start.celery_app, "send_task"):
        control.campaign_resume(campaign=campaign, retry_failed=True)
    run_here(campaign)
    # Every unit has its output under v2 (the untrained model's low confidence
    # sends some to review: flagged, not failed).
    assert not units.exclude(output_path__startswith=f"shapes/{v2.label}/").exists()
    assert not units.filter(state=UnitState.FAILED).exists()


@pytest.mark.django_db
def test_the_export_gathers_predictions_and_features_and_says_which_output_it_could_not_read(
    user_model, shapes, project, output_root, run_here, tmp_path, client, owner
):
    import csv

    from campaigns.exports.inventory import export

    campaign = _classified(user_model, shapes, project, run_here)
    label = campaign.current_version.label
    done = list(Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).order_by("pk"))
    assert len(done) == 30

    written = {p.name for p in export(campaign, tmp_path / "out")}
    assert {f"predictions-{label}.csv", f"features-{label}.npy"} <= written
    with open(tmp_path / "out" / f"predictions-{label}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    features = np.load(tmp_path / "out" / f"features-{label}.npy")
    assert features.shape == (30, 16) and features.dtype == np.float32
    assert [r["id"] for r in rows] == [u.uid for u in done]  # unit order, row i = matrix row i
    for unit, row in zip(done, rows, strict=True):
        metrics = Attempt.objects.get(unit=unit).metrics
        assert row["label_1"] == metrics["category"]
        assert float(row["probability_1"]) == pytest.approx(metrics["probability"], abs=1e-4)
        assert float(row["margin"]) == pytest.approx(metrics["margin"], abs=1e-4)
        assert {row["label_1"], row["label_2"], row["label_3"]} == set(CLASSES)
        with np.load(output_root / unit.output_path) as out:
            assert np.array_equal(features[int(row["row"])], out["features"])

    # An output deleted since: its row says so, the others are whole.
    lost = done[4]
    (output_root / lost.output_path).unlink()
    export(campaign, tmp_path / "again")
    with open(tmp_path / "again" / f"predictions-{label}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    again = np.load(tmp_path / "again" / f"features-{label}.npy")
    assert rows[4]["id"] == lost.uid and rows[4]["label_1"] == ""
    assert rows[4]["error"].startswith("output unreadable: ") and np.isnan(again[4]).all()
    assert all(r["error"] == "" for i, r in enumerate(rows) if i != 4)
    assert np.array_equal(np.delete(again, 4, axis=0), np.delete(features, 4, axis=0))

    # The page offers the same table to download (a text campaign has none: test_views).
    client.force_login(owner)
    page = client.get(reverse("campaign_detail", args=[campaign.name])).content.decode()
    url = reverse("campaign_export", args=[campaign.name, "predictions.csv"])
    assert f'href="{url}"' in page
    body = b"".join(client.get(url).streaming_content).decode()
    assert body.splitlines()[0].startswith("row,id,source_path,category,output_path,label_1,")
    assert len(body.splitlines()) == 31


def test_the_margin_is_top_1_minus_top_2_of_every_class_whatever_top_k(user_model):
    import io

    from campaigns.specs.builtin import IMAGE_CLASSIFICATION
    from gpuworker.processors import get_processor

    # Shapes the model is sure of, and a blank grey it hesitates on (about
    # 0.78 against 0.19): there top-1 alone is far from the margin.
    rng = random.Random(7)
    images = [shape_image(kind, rng) for kind in CLASSES]
    images.append(Image.new("RGB", (SIZE, SIZE), (128, 128, 128)))
    inputs = []
    for image in images:
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        inputs.append(buf.getvalue())

    margins, probs = {}, None
    for top_k in (1, 3):
        params = IMAGE_CLASSIFICATION.clean(classifier_params(user_model, top_k=top_k))
        processor = get_processor("image-classification", params)
        result = processor.run([processor.prepare(data) for data in inputs])
        margins[top_k] = [float(processor.output(result, i)["margin"]) for i in range(len(inputs))]
        probs = result.probs

    ranked = np.sort(probs, axis=1)[:, ::-1]
    expected = (ranked[:, 0] - ranked[:, 1]).tolist()
    assert margins[1] == pytest.approx(expected, abs=1e-6)
    assert margins[3] == pytest.approx(expected, abs=1e-6)


@pytest.fixture
def tiny_architecture(settings):
    settings.BRIEFGPU_IMAGE_ARCHITECTURES = {
        "tiny": "tests.gpuworker.test_image_classification:TinyLogits"
    }


@pytest.mark.django_db
@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_a_state_dict_of_a_named_architecture_classifies_as_the_whole_model_does(
    user_model, shapes, project, output_root, run_here, tiny_architecture, tmp_path, suffix
):
    from safetensors.torch import save_file

    state = torch.jit.load(str(user_model[0])).state_dict()
    weights = tmp_path / f"tiny{suffix}"
    if suffix == ".safetensors":
        save_file(dict(state), str(weights))
    else:
        torch.save(dict(state), str(weights))
    whole = _classified(user_model, shapes, project, run_here)
    named = _classifier(
        "named", project, shapes, _params((weights, user_model[1]), architecture="tiny")
    )
    run_here(named)

    outputs = {
        u.uid: u.output_path for u in Unit.objects.filter(campaign=named, state=UnitState.SUCCEEDED)
    }
    assert len(outputs) == 30
    for unit in Unit.objects.filter(campaign=whole, state=UnitState.SUCCEEDED):
        with (
            np.load(output_root / unit.output_path) as a,
            np.load(output_root / outputs[unit.uid]) as b,
        ):
            assert list(a["top_labels"]) == list(b["top_labels"])
            assert np.allclose(a["top_probs"], b["top_probs"], atol=1e-5)
            # The penultimate layer, taken at the last Linear's input: the
            # features the whole model returns itself.
            assert np.allclose(a["features"], b["features"], atol=1e-5)
    assert named.current_version.params["architecture"] == "tiny"


@pytest.mark.django_db
def test_a_state_dict_that_does_not_fit_its_architecture_fails_the_batch_clearly(
    user_model, shapes, project, output_root, run_here, tiny_architecture, tmp_path
):
    state = dict(torch.jit.load(str(user_model[0])).state_dict())
    del state["head.bias"]
    weights = tmp_path / "partial.pt"
    torch.save(state, str(weights))
    campaign = _classifier(
        "partial",
        project,
        shapes / "circle",
        _params((weights, user_model[1]), architecture="tiny"),
    )
    run_here(campaign)
    messages = set(Unit.objects.filter(campaign=campaign).values_list("error_message", flat=True))
    assert len(messages) == 1 and 'Missing key(s) in state_dict: "head.bias"' in messages.pop()


@pytest.mark.parametrize(
    ("architecture", "model", "said"),
    [
        ("vgg-ish", "w.safetensors", "unknown architecture 'vgg-ish'.*tiny"),
        ("tiny", "tiny.pt2", "the model is its state dict"),
    ],
)
def test_an_architecture_the_workers_cannot_build_is_refused_before_a_version(
    tiny_architecture, architecture, model, said, tmp_path
):
    from campaigns.specs.builtin import IMAGE_CLASSIFICATION

    params = {"model": str(tmp_path / model), "labels": "l.txt", "architecture": architecture}
    with pytest.raises(ValidationError, match=said):
        IMAGE_CLASSIFICATION.clean(params)


def test_a_torchvision_architecture_needs_torchvision_beside_torch(tmp_path):
    import importlib.util

    from campaigns.specs.builtin import IMAGE_CLASSIFICATION

    params = {"model": str(tmp_path / "w.pt"), "labels": "l.txt"}
    params["architecture"] = "torchvision:resnet18"
    if importlib.util.find_spec("torchvision") is None:  # these machines: see README
        with pytest.raises(ValidationError, match="torchvision is not installed here"):
            IMAGE_CLASSIFICATION.clean(params)
    else:
        assert IMAGE_CLASSIFICATION.clean(params)["architecture"] == "torchvision:resnet18"
