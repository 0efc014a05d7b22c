"""A user's own processor, registered by dotted path, through the same path as built-ins."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from campaigns.models import Campaign, Unit
from campaigns.runs import setup
from campaigns.specs import processors as processor_specs
from campaigns.specs.software import processor_software
from campaigns.verify.reconcile import campaign_verify
from tests.conftest import DEMO_BAD, DEMO_GOOD


@pytest.fixture
def plugin(settings):
    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.text_stats.SPEC"]
    processor_specs._registry.cache_clear()
    yield
    processor_specs._registry.cache_clear()


@pytest.mark.django_db
def test_a_plugin_processor_runs_end_to_end(plugin, corpus, output_root, run_here):
    out = StringIO()
    call_command(
        "campaign",
        "create",
        "stats",
        "--processor",
        "text-stats",
        "--input",
        str(corpus),
        "--param",
        "batch_policy=length_grouped",
        stdout=out,
    )
    campaign = Campaign.objects.get(name="stats")
    assert campaign.current_version.params == {
        "batch_size": 8,
        "batch_policy": "length_grouped",
        "lowercase": "no",
    }
    run_here(campaign)
    unit = Unit.objects.get(campaign=campaign, uid="short/question.txt")
    record = json.loads((Path(output_root) / unit.output_path).read_text())
    assert record == {"chars": 36, "words": 6, "lines": 2}
    assert unit.output_path.endswith(".json")
    assert unit.cost == (corpus / "short/question.txt").stat().st_size
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert (report["valid"], report["input_invalid"]) == (DEMO_GOOD, DEMO_BAD)
    # Outside any distribution and the portal's own code: its source's hash says what ran.
    source = Path(__file__).parent.parent / "plugins" / "text_stats.py"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    software = campaign.current_version.software
    assert software["processor"] == f"tests.plugins.text_stats sha256:{digest}"
    assert software["pillow"] == metadata.version("pillow")


@pytest.mark.django_db
def test_a_plugin_refuses_unknown_parameters_like_a_builtin(plugin, corpus, project):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="unknown parameter.*pooling"):
        setup.campaign_create(
            name="s",
            processor="text-stats",
            project=project,
            input_folder=corpus,
            params={"pooling": "mean"},
        )


def test_without_the_setting_the_plugin_is_unknown():
    processor_specs._registry.cache_clear()
    assert "text-stats" not in processor_specs.all_specs()
    assert "text-embedding" in processor_specs.all_specs()


def test_an_installed_package_registers_a_processor_by_entry_point(tmp_path, monkeypatch):
    dist = tmp_path / "briefgpu_text_stats-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: briefgpu-text-stats\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[briefgpu.processors]\ntext-stats = tests.plugins.text_stats:SPEC\n"
    )
    (dist / "top_level.txt").write_text("tests\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    processor_specs._registry.cache_clear()
    try:
        spec = processor_specs.get_spec("text-stats")
        assert spec.implementation == "tests.plugins.text_stats:TextStats"
        # A version names the package and its version.
        assert processor_software(spec.implementation) == {"processor": "briefgpu-text-stats 0.1"}
    finally:
        processor_specs._registry.cache_clear()
