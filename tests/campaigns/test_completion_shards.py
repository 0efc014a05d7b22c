"""A text-generation batch's completions in one JSON Lines shard: a line a
unit that any JSON Lines reader takes, each unit's size and sha256 its
line's; a batch delivered again adopts the lines its dead claim wrote for
the inputs its units read now, and recomputes the rest; verify checks each
line (quick: there, this unit's, its size; deep: its bytes and fields) and
sets a shard that cannot be read aside."""

from __future__ import annotations

import hashlib
import json
from io import StringIO
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
from django.core.management import call_command

from campaigns.models import Attempt, Batch, Campaign, Unit, UnitState
from campaigns.runs import start
from campaigns.storage.vector_shards import split_member
from campaigns.verify.reconcile import campaign_verify
from gpuworker.runner.batch import run_batch
from tests.generation import damage_line, tiny_causal_lm, written_completion

pytestmark = pytest.mark.django_db

PROMPTS = [f"the quick brown fox {i} " * (1 + i % 3) for i in range(10)]


@pytest.fixture
def campaign(tmp_path, project, output_root, django_capture_on_commit_callbacks) -> Campaign:
    model = tiny_causal_lm(tmp_path / "lm")
    corpus = tmp_path / "prompts"
    corpus.mkdir()
    for i, text in enumerate(PROMPTS):
        (corpus / f"q{i}.txt").write_text(text)
    (corpus / "empty.txt").write_text("")
    call_command(
        "campaign",
        "create",
        "lines",
        "--processor=text-generation",
        f"--input={corpus}",
        f"--project={project.name}",
        f"--param=model={model}",
        "--param=max_new_tokens=6",
        "--param=batch_policy=original",
        "--param=batch_size=4",
        "--param=flag_length=no",
        stdout=StringIO(),
    )
    made = Campaign.objects.get(name="lines")
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=made)
    return made


def _run_all(campaign: Campaign) -> None:
    for batch in Batch.objects.filter(campaign=campaign).order_by("pk"):
        run_batch(batch.pk)


def _shards(output_root: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in Path(output_root).rglob("*.jsonl")}


def test_a_batch_writes_one_json_lines_shard_a_line_a_unit(campaign, output_root):
    _run_all(campaign)
    done = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).order_by("uid")
    assert done.count() == len(PROMPTS)
    # one file a batch that wrote anything, none a unit
    shards = _shards(output_root)
    assert len(shards) == Batch.objects.filter(campaign=campaign).count()
    assert not list(Path(output_root).rglob("*.json"))
    for unit in done:
        file_rel, row = split_member(unit.output_path)
        assert file_rel.endswith(".jsonl") and row is not None
        line = (Path(output_root) / file_rel).read_bytes().split(b"\n")[row]
        assert unit.output_size == len(line)
        assert unit.output_sha256 == hashlib.sha256(line).hexdigest()
        record = json.loads(line)
        assert record["id"] == unit.uid and record["input_sha256"] == unit.sha256
        assert written_completion(output_root, unit)["completion"] == record["completion"]
    # any JSON Lines reader takes a shard
    table = pd.read_json(next(iter(shards)), lines=True)
    assert list(table.columns) == [
        "id",
        "completion",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "input_sha256",
    ]
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["valid"] == len(PROMPTS) and report["orphan_outputs"] == 0


def test_a_redelivered_batch_adopts_the_lines_its_dead_claim_wrote(
    campaign, output_root, monkeypatch
):
    # the dead claims' lease records stay (a claim that died never removed them)
    monkeypatch.setattr("gpuworker.runner.pipeline.drop_lease_records", lambda batch: None)
    _run_all(campaign)
    shards = _shards(output_root)
    first = {
        u.uid: written_completion(output_root, u) for u in Unit.objects.exclude(output_path="")
    }
    # the workers died after writing, before recording: the database forgot
    _forget(campaign)
    # and one prompt changed meanwhile: its line is not adopted, it runs again
    changed = Unit.objects.get(campaign=campaign, uid="q1.txt")
    Path(campaign.input_root, "q1.txt").write_text("a cat sleeps in the sun")
    Unit.objects.filter(pk=changed.pk).update(
        sha256=hashlib.sha256(b"a cat sleeps in the sun").hexdigest(), size=23
    )
    _run_all(campaign)

    assert Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).count() == len(PROMPTS)
    adopted = Attempt.objects.filter(unit__campaign=campaign, metrics__adopted=True)
    assert sorted(adopted.values_list("unit__uid", flat=True)) == sorted(
        f"q{i}.txt" for i in range(len(PROMPTS)) if i != 1
    )
    # the adopted lines are the very ones written, in their files untouched
    for unit in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED):
        if unit.uid != "q1.txt":
            assert written_completion(output_root, unit) == first[unit.uid]
            assert Path(output_root, split_member(unit.output_path)[0]) in shards
    again = Unit.objects.get(pk=changed.pk)
    assert Path(output_root, split_member(again.output_path)[0]) not in shards
    assert (
        json.loads(
            Path(output_root, split_member(again.output_path)[0]).read_bytes().split(b"\n")[0]
        )["input_sha256"]
        == hashlib.sha256(b"a cat sleeps in the sun").hexdigest()
    )


def test_a_shard_cut_short_is_not_adopted_but_recomputed(campaign, output_root, monkeypatch):
    monkeypatch.setattr("gpuworker.runner.pipeline.drop_lease_records", lambda batch: None)
    batch = Batch.objects.filter(campaign=campaign).order_by("pk").first()
    run_batch(batch.pk)
    (shard,) = _shards(output_root)
    shard.write_bytes(shard.read_bytes()[:-7])  # the disk lost the file's end
    Unit.objects.filter(batch=batch, state=UnitState.SUCCEEDED).update(
        state=UnitState.QUEUED, output_path="", output_size=None, output_sha256=""
    )
    Batch.objects.filter(pk=batch.pk).update(state=Batch.State.QUEUED, deliveries=1)
    run_batch(batch.pk)
    assert not Attempt.objects.filter(unit__campaign=campaign, metrics__adopted=True).exists()
    assert Unit.objects.filter(batch=batch, state=UnitState.SUCCEEDED).count() == 3
    for unit in Unit.objects.filter(batch=batch):
        assert split_member(unit.output_path)[0] != str(shard.relative_to(output_root))


def test_verify_checks_each_line_and_sets_an_unreadable_shard_aside(campaign, output_root):
    _run_all(campaign)
    units = list(Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).order_by("pk"))
    damaged = units[0]
    damage_line(output_root, damaged)
    quick = campaign_verify(campaign=campaign).as_dict()
    # its size differs from the one recorded: even the quick check sees it
    assert quick["output_incomplete"] == 1 and quick["valid"] == len(PROMPTS) - 1
    assert Unit.objects.get(pk=damaged.pk).state == UnitState.PENDING

    # a line changed in place, same size: the deep check compares its bytes
    other = units[5]
    file_rel, row = split_member(other.output_path)
    path = Path(output_root) / file_rel
    lines = path.read_bytes().split(b"\n")
    record = json.loads(lines[row])
    record["prompt_tokens"] ^= 1  # another count of as many digits
    lines[row] = json.dumps(record, ensure_ascii=False).encode()
    path.write_bytes(b"\n".join(lines))
    assert campaign_verify(campaign=campaign).as_dict()["output_incomplete"] == 0
    deep = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert deep["output_incomplete"] == 1
    assert "checksum differs" in json.dumps(deep)

    # a shard that cannot be read at all: each of its units, and it is set aside
    last = units[-1]
    lost = Path(output_root) / split_member(last.output_path)[0]
    lost.write_bytes(lost.read_bytes()[:-3])
    in_it = Unit.objects.filter(
        output_path__startswith=str(lost.relative_to(output_root)), state=UnitState.SUCCEEDED
    ).count()
    cut = campaign_verify(campaign=campaign).as_dict()
    assert cut["output_incomplete"] == in_it >= 1
    assert not lost.exists() and cut["damaged_set_aside"] == 1


def _forget(campaign: Campaign) -> None:
    """The workers died after writing, before recording: the database forgot."""
    Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).update(
        state=UnitState.QUEUED, output_path="", output_size=None, output_sha256=""
    )
    Batch.objects.filter(campaign=campaign).update(state=Batch.State.QUEUED, deliveries=1)


def test_a_line_changed_since_its_claim_wrote_it_is_recomputed_never_adopted(
    campaign, output_root, monkeypatch
):
    # the dead claims' lease records stay (a claim that died never removed them)
    monkeypatch.setattr("gpuworker.runner.pipeline.drop_lease_records", lambda batch: None)
    _run_all(campaign)
    units = list(Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).order_by("pk"))
    flipped = units[2]
    file_rel, row = split_member(flipped.output_path)
    path = Path(output_root) / file_rel
    lines = path.read_bytes().split(b"\n")
    record = json.loads(lines[row])
    record["completion"] = record["completion"][::-1] + "x"  # still a valid completion
    lines[row] = json.dumps(record, ensure_ascii=False).encode()
    path.write_bytes(b"\n".join(lines))
    _forget(campaign)
    _run_all(campaign)
    adopted = set(
        Attempt.objects.filter(unit__campaign=campaign, metrics__adopted=True).values_list(
            "unit__uid", flat=True
        )
    )
    assert flipped.uid not in adopted and len(adopted) == len(PROMPTS) - 1
    again = Unit.objects.get(pk=flipped.pk)
    assert again.state == UnitState.SUCCEEDED
    assert written_completion(output_root, again)["completion"] != record["completion"]
    assert campaign_verify(campaign=campaign, deep=True).as_dict()["valid"] == len(PROMPTS)


def test_a_batch_past_a_parts_bytes_is_written_as_parts(campaign, output_root, monkeypatch):
    from campaigns.storage import row_shards

    monkeypatch.setattr(row_shards, "PART_BYTES", 300)  # about one line a part
    monkeypatch.setattr("gpuworker.runner.pipeline.drop_lease_records", lambda batch: None)
    _run_all(campaign)
    units = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
    parts = {split_member(u.output_path)[0] for u in units}
    assert len(parts) > Batch.objects.filter(campaign=campaign).count()
    assert any(p.endswith("-1.jsonl") for p in parts)
    first = {u.uid: written_completion(output_root, u) for u in units}
    # a claim that died after writing its parts: every line of every part adopted
    _forget(campaign)
    _run_all(campaign)
    adopted = Attempt.objects.filter(unit__campaign=campaign, metrics__adopted=True)
    assert adopted.count() == len(PROMPTS)
    for unit in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED):
        assert written_completion(output_root, unit) == first[unit.uid]
    assert campaign_verify(campaign=campaign, deep=True).as_dict()["valid"] == len(PROMPTS)
