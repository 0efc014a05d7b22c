"""A text-generation campaign through real workers: prompts as files and as
rows of a JSONL file (rows carrying a system prompt and a limit of their
own), bad ones among them; the worker is SIGKILLed mid-batch
twice, a new one finishes, resume finds nothing left. Every good prompt then
has exactly one completion, the one the model writes for it alone (greedy
decoding does not depend on the batch), and verify --deep passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaigns import selectors
from campaigns.intake.records import RecordColumns
from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.specs.generation import TEXT_GENERATION
from campaigns.verify.reconcile import campaign_verify
from gpuworker.processors.text_generation import TextGenerationProcessor
from tests.generation import tiny_causal_lm, written_completion
from tests.worker import finish_and_resume, kill_mid_batch

pytestmark = pytest.mark.integration

TOPICS = ["harbour", "railway", "library", "harvest", "solar", "backup", "tides", "vaccines"]
GOOD = 40


def _prompt(i: int) -> str:
    return f"{TOPICS[i % len(TOPICS)]} report {i} " * (1 + i % 5)


def _row_params(i: int) -> dict:
    """The JSONL variant's rows' own parameters (none for most)."""
    own: dict = {}
    if i % 3 == 0:
        own["system_prompt"] = f"be terse about {TOPICS[i % len(TOPICS)]}"
    if i % 4 == 1:
        own["max_new_tokens"] = 150 + i
    return own


def _create(kind: str, project, tmp_path: Path, params: dict):
    corpus = tmp_path / "prompts"
    corpus.mkdir()
    common = {"name": "gen-killed", "processor": "text-generation", "project": project}
    if kind == "folder":
        for i in range(GOOD):
            (corpus / f"p{i:02d}.txt").write_text(_prompt(i))
        (corpus / "empty.txt").write_bytes(b"")
        (corpus / "binary.txt").write_bytes(b"\x00\x01\x02")
        campaign, _ = setup.campaign_create(input_folder=corpus, params=params, **common)
        return campaign, {"empty.txt": "empty file", "binary.txt": "binary file"}
    rows = []
    for i in range(GOOD):
        own = _row_params(i)
        rows.append(
            {
                "id": f"p{i:02d}",
                "prompt": _prompt(i),
                "system": own.get("system_prompt"),
                "limit": own.get("max_new_tokens"),
            }
        )
    lines = [json.dumps(row) for row in rows]
    lines.insert(5, json.dumps({"id": "empty", "prompt": "   ", "system": None, "limit": None}))
    lines.insert(20, "{broken")
    lines.insert(30, json.dumps({"id": "greedy", "prompt": "hi", "system": None, "limit": 999}))
    path = corpus / "prompts.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    columns = RecordColumns(
        text="prompt", id="id", params=(("system_prompt", "system"), ("max_new_tokens", "limit"))
    )
    campaign, _ = setup.campaign_create(records=path, columns=columns, params=params, **common)
    return campaign, {
        "empty": "whitespace only",
        "prompts.jsonl:21": "is not JSON",
        "greedy": "this row's max_new_tokens: 999 is over the version's max_new_tokens 400",
    }


@pytest.mark.parametrize("kind", ["folder", "jsonl"])
def test_generation_survives_kills_and_resume_with_one_completion_a_prompt(
    start_worker, project, tmp_path, output_root, settings, kind
):
    # given: 40 prompts and bad ones, batches of 8 that generate 400 tokens, a 2 s lease
    settings.BATCH_LEASE_SECONDS = 2
    model = tiny_causal_lm(tmp_path / "lm")
    params = {"model": str(model), "max_new_tokens": 400, "batch_size": 8}
    params |= {"batch_policy": "length_grouped", "flag_length": "no"}
    campaign, bad = _create(kind, project, tmp_path, params)
    good = [f"p{i:02d}" + (".txt" if kind == "folder" else "") for i in range(GOOD)]
    start.campaign_run(campaign=campaign)

    # when: a worker is SIGKILLed while it holds a batch, twice
    kill_mid_batch(start_worker, campaign, 2, settle=0.1)

    # then: a new worker (with the sweeper) finishes, and resume finds nothing more
    finish_and_resume(start_worker, campaign, timeout=240)
    counts = selectors.campaign_counts(campaign=campaign)
    assert (counts.succeeded, counts.failed, counts.pending) == (GOOD, len(bad), 0)
    failed = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    assert set(failed) == set(bad)
    for uid, said in bad.items():
        assert said in failed[uid], (uid, failed[uid])
    assert Batch.objects.filter(campaign=campaign, deliveries__gte=2).count() >= 1

    # exactly one completion a prompt, the model's own for it, no partial file
    assert not [p for p in Path(output_root).rglob("*") if p.name.endswith(".tmp")]
    succeeded = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
    assert sorted(succeeded.values_list("uid", flat=True)) == good
    for i, uid in enumerate(good):
        unit = succeeded.get(uid=uid)
        assert Attempt.objects.filter(unit=unit, outcome="succeeded").count() == 1, uid
        record = written_completion(output_root, unit)
        own = _row_params(i) if kind == "jsonl" else {}
        processor = TextGenerationProcessor(TEXT_GENERATION.clean({**params, **own}))
        alone = processor.run([processor.prepare(_prompt(i).encode())]).completions[0]
        assert record["completion"] == alone.text, uid
        assert record["finish_reason"] == alone.finish_reason
        assert record["completion_tokens"] == alone.completion_tokens
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["valid"] == GOOD and report["input_invalid"] == len(bad)
    assert report["output_missing"] == report["orphan_outputs"] == 0
