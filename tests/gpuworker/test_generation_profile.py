"""The batch-size profile of a text generation is measured on the KV cache at
its largest: the heaviest prompts, every one generating max_new_tokens. Its
memory grows with prompt length × batch, and the chosen size keeps the
margin on the longest prompts while short ones fit many more."""

from __future__ import annotations

from unittest import mock

import pytest

from campaigns.profiles.services import profile_create
from campaigns.runs import setup
from gpuworker.memory import allocated_now, cpu
from gpuworker.processors import get_processor
from gpuworker.processors.text_generation import TextGenerationProcessor
from gpuworker.profiler import profile_run
from tests.generation import tiny_causal_lm

MiB = 1024 * 1024


@pytest.fixture
def prompts(tmp_path):
    root = tmp_path / "prompts"
    root.mkdir()
    for i in range(60):
        (root / f"short-{i:02d}.txt").write_text(f"the fox {i}")
    for i in range(5):
        (root / f"long-{i}.txt").write_text(f"report {i} " + "the lazy dog " * 150)
    return root


@pytest.mark.django_db
def test_the_profile_measures_generation_memory_by_prompt_length_and_batch(
    project, prompts, tmp_path, output_root
):
    model = tiny_causal_lm(tmp_path / "lm")
    campaign, _ = setup.campaign_create(
        name="gen-profile",
        processor="text-generation",
        project=project,
        input_folder=prompts,
        params={"model": str(model), "max_new_tokens": 32, "batch_policy": "length_grouped"},
    )
    processor = get_processor("text-generation", campaign.current_version.params)
    processor.run_longest([processor.prepare(b"warm up")] * 4)
    margin = 0.2
    # 64 short prompts fit many times over; 64 long ones (~750 tokens each) take ~100 MiB
    budget = int((allocated_now(cpu()) + 60 * MiB) / (1 - margin))
    profile = profile_create(
        campaign=campaign, margin=margin, memory_budget=budget, max_batch_size=64, sample_size=24
    )
    longest = TextGenerationProcessor.run_longest
    results = []

    def measured(self, items):
        results.append(longest(self, items))
        return results[-1]

    with mock.patch.object(TextGenerationProcessor, "run_longest", measured):
        assert profile_run(profile.pk) == "done"
    profile.refresh_from_db()
    # every step measured the longest run: each prompt generating max_new_tokens
    assert len(results) == len(profile.steps)
    assert {c.completion_tokens for r in results for c in r.completions} == {32}

    count = {s["batch_size"]: s for s in profile.steps if s["phase"] == "count"}
    heaviest = {s["batch_size"]: s for s in profile.steps if s["phase"] == "heaviest"}
    # short prompts fit at 64; the long ones set the chosen size, below it
    assert count[64]["fits"], profile.steps
    assert 1 <= profile.chosen_batch_size < 64, profile.steps
    # each step generated max_new_tokens a prompt: its padded cost says prompt + 32
    assert all(s["max_cost"] > 700 for s in heaviest.values())
    # memory grows with the batch on long prompts, and is larger than short prompts' at a size
    sizes = sorted(heaviest)
    assert len(sizes) >= 3, profile.steps
    peaks = [heaviest[size]["peak_reserved"] for size in sizes]
    assert peaks[-1] > peaks[0] + 10 * MiB, (sizes, peaks)
    shared = [size for size in sizes if size in count and size >= 8]
    assert shared, profile.steps
    for size in shared:
        assert heaviest[size]["peak_reserved"] > count[size]["peak_reserved"], size
    # the chosen size kept the margin on the heaviest prompts
    chosen = heaviest[profile.chosen_batch_size]
    assert chosen["peak_reserved"] <= (1 - margin) * budget
