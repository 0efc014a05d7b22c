"""A record campaign set up on the page: a records file inside a folder of the
project, its columns named, refusals said on their field and nothing made."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.urls import reverse

from campaigns.models import Campaign, ProjectFolder, Unit, UnitState
from campaigns.runs import start
from campaigns.specs.builtin import TEXT_EMBEDDING

pytestmark = pytest.mark.django_db
NEW = reverse("campaign_new")

ROWS = [
    {"id": "r1", "text": "The harbour reopened on Monday.", "topic": "port"},
    {"id": "r2", "text": "", "topic": "port"},
    {"id": "r3", "text": "Trains run again on the coast line.", "topic": "rail"},
]


@pytest.fixture
def tables(tmp_path, settings, allow_folder) -> Path:
    """A folder of acme's inside CORPUS_ROOTS, holding records in each format."""
    folder = tmp_path / "corpora" / "tables"
    folder.mkdir(parents=True)
    settings.CORPUS_ROOTS = [folder.parent]
    allow_folder(folder)
    (folder / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (folder / "docs.csv").write_text(
        "id,text,topic\n" + "".join(f"{r['id']},{r['text']},{r['topic']}\n" for r in ROWS)
    )
    pq.write_table(pa.Table.from_pylist(ROWS), folder / "docs.parquet")
    (folder / "notes.txt").write_text("not records")
    (folder / "broken.parquet").write_bytes(b"PAR1 this is no Parquet file")
    (folder / "broken.jsonl.gz").write_bytes(b"this is no gzip stream\n")
    return folder


@pytest.fixture
def send():
    with mock.patch.object(start.celery_app, "send_task") as send:
        yield send


def _form(folder: Path, **extra) -> dict:
    data = {
        "project": "acme",
        "name": "rows",
        "processor": "text-embedding",
        "folder": str(folder),
        "source": "records",
        "records": "docs.jsonl",
        "id_column": "id",
        "text_column": "text",
        "category_column": "topic",
        **{f"param_{k}": v for k, v in TEXT_EMBEDDING.clean({}).items()},
    }
    data.update(extra)
    return data


def test_the_page_offers_the_records_files_of_the_project(client, owner, tables):
    client.force_login(owner)
    html = client.get(NEW).content.decode()
    assert 'name="source" value="records"' in html
    assert f'<option value="{tables / "docs.parquet"}">' in html
    assert "notes.txt" not in html


def test_preview_shows_the_rows_and_the_bad_ones_and_creates_nothing(client, owner, tables, send):
    client.force_login(owner)
    response = client.post(NEW, _form(tables, action="preview"))
    html = response.content.decode()
    assert response.status_code == 200, response.context["form"].errors
    assert "3 inputs" in html
    first = html.split('class="grid first"')[1].split("</table>")[0]
    assert "r1" in first and "r3" in first and "port" in first and "rail" in first
    failing = html.split('class="grid failing"')[1].split("</table>")[0]
    assert "r2" in failing and "empty text" in failing
    assert not Campaign.objects.exists() and not send.called


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.csv", "docs.parquet"])
def test_create_makes_a_unit_of_each_row(
    client, owner, tables, send, name, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(NEW, _form(tables, action="create", records=name))
    assert response.status_code == 302, response.context["form"].errors
    campaign = Campaign.objects.get(name="rows")
    assert campaign.input_root == str(tables.resolve())
    assert campaign.records["source"] == name
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert sorted(units) == ["r1", "r2", "r3"]
    assert units["r2"].state == UnitState.FAILED and "empty text" in units["r2"].error_message
    assert units["r3"].category == "rail"
    assert units["r1"].state == units["r3"].state == UnitState.QUEUED
    assert send.called
    page = client.get(reverse("campaign_detail", args=["rows"])).content.decode()
    assert "r1" in page and "r3" in page


def test_an_absolute_path_inside_the_project_is_taken(client, owner, tables, send):
    client.force_login(owner)
    response = client.post(
        NEW, _form(tables, action="create", records=str(tables / "docs.parquet"))
    )
    assert response.status_code == 302, response.context["form"].errors
    assert Campaign.objects.get(name="rows").records["source"] == "docs.parquet"


def _refused(client, data) -> dict:
    response = client.post(NEW, data)
    assert response.status_code == 400
    assert not Campaign.objects.exists() and not Unit.objects.exists()
    errors = response.context["form"].errors
    html = response.content.decode()
    for messages in errors.values():
        for message in messages:
            # said on the page, escaped as Django escapes it
            assert message.split("'")[0][:40] in html
    return errors


@pytest.mark.parametrize(
    ("change", "field", "said"),
    [
        ({"records": "docs.csv", "text_column": "body"}, "text_column", "no column 'body'"),
        ({"records": "docs.parquet", "id_column": "uid"}, "id_column", "no column 'uid'"),
        ({"records": "docs.jsonl", "category_column": "kind"}, "category_column", "'kind'"),
        ({"records": "notes.txt"}, "records", "records are .jsonl"),
        ({"records": "missing.jsonl"}, "records", "records not found"),
        ({"records": "broken.parquet"}, "records", "cannot be read as Parquet"),
        ({"records": "broken.jsonl.gz"}, "records", "cannot be read"),
        ({"records": ""}, "records", "name the records file"),
        ({"text_column": ""}, "text_column", "the column that holds each row's text"),
    ],
)
def test_a_records_mistake_is_said_on_its_field_and_nothing_is_made(
    client, owner, tables, send, change, field, said
):
    client.force_login(owner)
    errors = _refused(client, _form(tables, action="create", **change))
    assert said in " ".join(errors[field]), errors
    preview = client.post(NEW, _form(tables, action="preview", **change))
    assert preview.status_code == 400 and said in " ".join(preview.context["form"].errors[field])
    assert not send.called


def test_records_outside_the_projects_folders_are_refused(client, owner, tables, tmp_path, send):
    # given: records outside every folder of acme, and a link to them inside one
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    (tables / "link.jsonl").symlink_to(elsewhere / "secret.jsonl")
    client.force_login(owner)
    for given in (str(elsewhere / "secret.jsonl"), "link.jsonl", "../../elsewhere/secret.jsonl"):
        errors = _refused(client, _form(tables, action="create", records=given))
        assert "is not inside a folder of project acme" in " ".join(errors["records"]), given
    assert ProjectFolder.objects.count() == 1
    assert not send.called


def test_records_are_offered_to_text_processors_only(client, owner, tables, send):
    client.force_login(owner)
    # choosing an image processor swaps the inputs' choice too: no records
    html = client.get(
        NEW,
        {"processor": "image-transform", "source": "records"},
        headers={"HX-Request": "true", "HX-Target": "params"},
    ).content.decode()
    source = html.split('<fieldset id="source" hx-swap-oob="true">')[1].split("</fieldset>")[0]
    assert 'value="records" disabled' in source and "reads files, not texts" in source
    html = client.get(
        NEW,
        {"processor": "text-embedding", "source": "records"},
        headers={"HX-Request": "true", "HX-Target": "params"},
    ).content.decode()
    source = html.split('<fieldset id="source" hx-swap-oob="true">')[1].split("</fieldset>")[0]
    assert 'value="records" checked' in source
    # and a post of records for it (a tampered form, no JavaScript) is refused
    data = _form(tables, action="create", processor="image-transform")
    data = {k: v for k, v in data.items() if not k.startswith("param_")}
    data["params_for"] = "image-transform"
    errors = _refused(client, data)
    assert "reads files, not texts" in " ".join(errors["source"])


def test_campaign_create_refuses_records_for_a_processor_that_takes_no_text(project, tables):
    from django.core.exceptions import ValidationError

    from campaigns.intake.records import RecordColumns
    from campaigns.runs import setup

    with pytest.raises(ValidationError, match="does not take text"):
        setup.campaign_create(
            name="pictures",
            processor="image-transform",
            project=project,
            records=tables / "docs.jsonl",
            columns=RecordColumns(text="text", id="id"),
        )
    assert not Campaign.objects.exists()


def test_a_manifest_kept_from_a_folder_preview_does_not_stop_a_records_file(
    client, owner, tables, send
):
    # given: the page kept a manifest from an earlier preview of a folder
    client.force_login(owner)
    data = _form(tables, action="create", manifest_token="a-manifest-long-gone.csv")
    # when: a records file is created instead: the manifest is no part of it
    response = client.post(NEW, data)
    assert response.status_code == 302, response.context["form"].errors
    assert Campaign.objects.get(name="rows").records["source"] == "docs.jsonl"


def test_the_preview_of_a_large_file_counts_only_its_start(
    client, owner, tables, send, monkeypatch
):
    from campaigns.web import setup_records

    monkeypatch.setattr(setup_records, "PREVIEW_COUNT", 2)
    client.force_login(owner)
    html = client.post(NEW, _form(tables, action="preview")).content.decode()
    assert "More than 2 rows (the preview counts no further)" in html
    assert not Campaign.objects.exists()
