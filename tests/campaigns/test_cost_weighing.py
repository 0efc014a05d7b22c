"""A processor's cost function never stops a campaign from being planned."""

from __future__ import annotations

from pathlib import Path

from campaigns.specs.processors import ProcessorSpec


def _plugin_cost(path: Path, params: dict) -> int:
    # A plugin's own bug on some inputs, not an OSError or a ValueError.
    if path.name.startswith("odd"):
        raise KeyError("no such field")
    return path.stat().st_size


def test_an_input_a_plugin_cost_cannot_weigh_costs_none(tmp_path):
    spec = ProcessorSpec(name="sizes", title="Sizes", output_suffix=".json", cost=_plugin_cost)
    (tmp_path / "a.txt").write_text("four")
    (tmp_path / "odd.txt").write_text("anything")
    (tmp_path / "b.txt").write_text("seven!!")

    weights = spec.weigh(tmp_path, ["a.txt", "odd.txt", "b.txt", "missing.txt"], {})

    assert weights == [4, None, 7, None]
