"""A text-generation campaign as a user makes one: prompts as rows of a JSONL
file (bad rows among them) through `campaign create --records`, run, verified,
exported as JSONL and Parquet (read back with pandas, ids in input order),
and shown on the unit page and in the review pane: the completion beside its
prompt."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from unittest import mock

import pandas as pd
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.urls import reverse

from campaigns.exports import completions
from campaigns.models import Campaign, ReviewItem, Unit, UnitState
from campaigns.specs.generation import TEXT_GENERATION
from campaigns.verify.reconcile import campaign_verify
from gpuworker.processors.text_generation import TextGenerationProcessor
from tests.generation import damage_line, tiny_causal_lm, written_completion

PROMPTS = [
    f"prompt {i}: " + " ".join(["the quick brown fox", "jumps over", "the lazy dog"][: 1 + i % 3])
    for i in range(14)
]


def _prompts_file(folder: Path) -> tuple[Path, dict[str, str]]:
    lines = [json.dumps({"id": f"p{i:02d}", "prompt": text}) for i, text in enumerate(PROMPTS)]
    lines.insert(3, json.dumps({"id": "empty", "prompt": ""}))
    lines.insert(7, "{not json")
    lines.insert(9, json.dumps({"id": "long", "prompt": "the lazy dog " * 40}))
    path = folder / "prompts.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path, {
        "empty": "empty text",
        "prompts.jsonl:8": "is not JSON",
        "long": "over max_prompt_tokens 64",
    }


@pytest.mark.django_db
def test_a_generation_campaign_over_records_runs_exports_and_shows_its_completions(
    tmp_path, output_root, run_here, project, client, admin_user
):
    model = tiny_causal_lm(tmp_path / "lm")
    records, bad = _prompts_file(tmp_path)
    params = {"model": str(model), "max_new_tokens": 10, "max_prompt_tokens": 64}
    params |= {"batch_size": 4, "flag_length": "no", "stop": json.dumps(["\n\n"])}
    args = [f"--param={key}={value}" for key, value in params.items()]
    call_command(
        "campaign",
        "create",
        "gen",
        "--processor=text-generation",
        f"--records={records}",
        "--id-column=id",
        "--text-column=prompt",
        f"--project={project.name}",
        *args,
        stdout=StringIO(),
    )
    campaign = Campaign.objects.get(name="gen")
    run_here(campaign)

    # every good prompt has its completion, every bad row failed with its reason
    failed = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    assert set(failed) == set(bad)
    for uid, said in bad.items():
        assert said in failed[uid], (uid, failed[uid])
    done = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).order_by("pk")
    assert [u.uid for u in done] == [f"p{i:02d}" for i in range(len(PROMPTS))]

    # what the worker wrote is the processor's own greedy text for each prompt, alone
    processor = TextGenerationProcessor(TEXT_GENERATION.clean(params))
    expected = [
        processor.run([processor.prepare(text.encode())]).completions[0] for text in PROMPTS
    ]
    for unit, completion in zip(done, expected, strict=True):
        record = written_completion(output_root, unit)
        assert record["completion"] == completion.text, unit.uid
        assert record["finish_reason"] == completion.finish_reason
        assert record["completion_tokens"] == completion.completion_tokens
        assert unit.cost == completion.prompt_tokens + 10

    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["valid"] == len(PROMPTS) and report["output_missing"] == 0

    # the export: JSONL and Parquet, the same rows, ids in input order
    out = tmp_path / "export"
    call_command("campaign", "export", "gen", "--to", str(out), stdout=StringIO())
    label = campaign.current_version.label
    table = pd.read_parquet(out / f"completions-{label}.parquet")
    assert list(table["id"]) == [f"p{i:02d}" for i in range(len(PROMPTS))]
    assert list(table["completion"]) == [c.text for c in expected]
    assert list(table["row"]) == list(range(len(PROMPTS)))
    assert set(table["error"]) == {""}
    exported = (out / f"completions-{label}.jsonl").read_text()
    lines = [json.loads(line) for line in exported.splitlines()]
    assert [line["id"] for line in lines] == list(table["id"])
    assert [line["completion_tokens"] for line in lines] == list(table["completion_tokens"])

    # a row group ends at GROUP_BYTES of completions, whatever their count
    with mock.patch.object(completions, "GROUP_BYTES", 40):
        call_command("campaign", "export", "gen", "--to", str(out), stdout=StringIO())
    grouped = pq.ParquetFile(out / f"completions-{label}.parquet")
    assert grouped.metadata.num_row_groups > 3
    assert list(grouped.read().column("id").to_pylist()) == list(table["id"])

    # an output damaged since keeps its row, with the reason; the batch's others are read
    damage_line(output_root, done[2])
    client.force_login(admin_user)
    url = reverse("version_download", args=["gen", 1, "completions.jsonl"])
    body = b"".join(client.get(url).streaming_content).decode()
    rows = [json.loads(line) for line in body.splitlines()]
    assert len(rows) == len(PROMPTS)
    assert rows[2]["completion"] is None and "output unreadable" in rows[2]["error"]
    assert rows[3]["completion"] == expected[3].text
    url = reverse("version_download", args=["gen", 1, "completions.parquet"])
    data = b"".join(client.get(url).streaming_content)
    (tmp_path / "dl.parquet").write_bytes(data)
    assert list(pd.read_parquet(tmp_path / "dl.parquet")["id"]) == list(table["id"])

    # the campaign page: each batch's generated tokens and their rate
    page = client.get(reverse("campaign_detail", args=["gen"])).content.decode()
    generated = sum(c.completion_tokens for c in expected)
    assert "<th>Generated tokens</th><th>Generated/s</th>" in page
    assert f"<td data-generated>{generated}</td>" in page  # one batch: every prompt

    # the unit page: the prompt, and the completion beside it
    unit = done[4]
    page = client.get(reverse("unit_detail", args=["gen", unit.pk])).content.decode()
    assert "<h3>Prompt</h3>" in page and "<h3>Completion</h3>" in page
    assert PROMPTS[4] in page
    assert f">{expected[4].text}</pre>" in page or expected[4].text == ""
    assert "generated" in page


@pytest.mark.django_db
def test_a_flagged_completion_waits_in_the_review_queue_beside_its_prompt(
    tmp_path, output_root, run_here, project, client, admin_user
):
    model = tiny_causal_lm(tmp_path / "lm")
    corpus = tmp_path / "prompts"
    corpus.mkdir()
    for i, text in enumerate(PROMPTS[:4]):
        (corpus / f"q{i}.txt").write_text(text)
    call_command(
        "campaign",
        "create",
        "cut",
        "--processor=text-generation",
        f"--input={corpus}",
        f"--project={project.name}",
        f"--param=model={model}",
        "--param=max_new_tokens=3",
        stdout=StringIO(),
    )
    campaign = Campaign.objects.get(name="cut")
    run_here(campaign)
    # a random model writes to the end: each completion is cut, and flagged so
    items = ReviewItem.objects.filter(campaign=campaign, reason="stopped_by_length")
    assert items.count() == 4
    item = items.order_by("pk").first()
    client.force_login(admin_user)
    pane = client.get(
        f"{reverse('review_queue')}?campaign=cut&item={item.pk}", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "completion cut at max_new_tokens" in pane
    assert "<h3>Completion</h3>" in pane and "length: cut at max_new_tokens" in pane
    assert PROMPTS[int(item.unit.uid[1])] in pane
