"""Training examples are read as every other input is: through read_bytes, under
the version's max_input_bytes. A file over it fails its unit, classified and
with its size, before it is read; the rest trains."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from campaigns.models import Training, Unit, UnitState
from campaigns.runs import setup
from campaigns.specs.processors import get_spec
from gpuworker.training_tasks import read_examples, text_trainer
from tests.gpuworker.test_adaptation import train_here, write_pairs  # noqa: F401

MiB = 1 << 20


@pytest.fixture
def oversized_pairs(tmp_path):
    """Six ordinary pairs, and one valid pair of 20 MiB (its positive a long document)."""
    root = tmp_path / "pairs"
    write_pairs(root, 6)
    huge = {"anchor": "what does the long report say?", "positive": "word " * (4 * MiB)}
    (root / "huge.json").write_text(json.dumps(huge))
    return root


def _campaign(project, folder, **params):
    campaign, _ = setup.campaign_create(
        name="adapt-sizes",
        processor="text-adaptation",
        project=project,
        input_folder=folder,
        params={"batch_size": 2, "epochs": 1, "checkpoint_every": 100, **params},
        holdout_share=0,
    )
    return campaign


def test_an_example_over_max_input_bytes_fails_its_unit_and_the_rest_trains(
    project,
    oversized_pairs,
    output_root,
    train_here,  # noqa: F811 (the imported fixture)
):
    # given: the default cap of a text example (16 MiB), and one file of 20 MiB
    campaign = _campaign(project, oversized_pairs)
    assert campaign.current_version.params["max_input_bytes"] == 16 * MiB

    # when: it trains
    training = train_here(campaign)

    # then: the large file failed, classified, with its size; the six others trained
    assert training.state == Training.State.DONE, training.error
    huge = Unit.objects.get(campaign=campaign, uid="huge.json")
    assert huge.state == UnitState.FAILED
    assert huge.error_class == "input_invalid"
    assert "over max_input_bytes 16,777,216" in huge.error_message
    assert training.examples == 6


def test_reading_the_examples_holds_nothing_of_a_file_over_the_cap(project, oversized_pairs):
    campaign = _campaign(project, oversized_pairs, max_input_bytes=64 * 1024)
    _trainer, parse, _base = text_trainer(campaign.current_version.params)

    tracemalloc.start()
    try:
        train, _heldout, rows = read_examples(campaign, parse)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    # the 20 MiB file was refused from its size, never read: the whole read
    # allocates a fraction of it
    assert len(train) == len(rows) == 6
    assert peak < 2 * MiB, peak
    huge = Unit.objects.get(campaign=campaign, uid="huge.json")
    assert "over max_input_bytes 65,536" in huge.error_message


def test_the_setup_check_reads_an_example_under_the_same_cap(oversized_pairs):
    from campaigns.intake.importing import preview

    # both adaptation processors have a cap by default
    for name in ("text-adaptation", "image-adaptation"):
        assert get_spec(name).params["max_input_bytes"].default > 0, name
    spec = get_spec("text-adaptation")
    params = spec.clean({"max_input_bytes": 64 * 1024})
    found = preview(
        root=oversized_pairs,
        manifest=None,
        check_input=spec.check_input,
        params=params,
        limits=spec.input_limits(params),
    )
    assert [(f["id"], "over max_input_bytes" in f["reason"]) for f in found.failing] == [
        ("huge.json", True)
    ]
