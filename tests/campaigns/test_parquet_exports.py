"""Outputs as a table: each version's Parquet file, written by `campaign
export` beside its matrix and downloaded from the versions section, read back
with pandas and pyarrow (campaigns/exports/tables.py)."""

from __future__ import annotations

import csv
import io
import json
import tracemalloc

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.urls import reverse

from campaigns.exports import matrices, tables
from campaigns.exports.inventory import consolidate_vectors, export
from campaigns.models import Unit, UnitState
from campaigns.runs import setup
from tests.gpuworker.test_image_classification import (  # noqa: F401 (fixtures)
    CLASSES,
    classifier_params,
    shapes,
    user_model,
)

pytestmark = pytest.mark.django_db


def _done_ids(campaign) -> list[str]:
    """Succeeded units in import order."""
    return list(
        Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
        .order_by("pk")
        .values_list("uid", flat=True)
    )


def _download(client, campaign, number: int, filename: str) -> bytes:
    response = client.get(reverse("version_download", args=[campaign.name, number, filename]))
    assert response.status_code == 200, response
    assert response.streaming
    return b"".join(response.streaming_content)


def test_the_vectors_table_round_trips_through_pandas_in_import_order(
    make_campaign, output_root, run_here, client, owner, tmp_path
):
    # given: a text-embedding campaign run to the end
    campaign = make_campaign("table", batch_size=4)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    version = campaign.current_version
    ids = _done_ids(campaign)
    assert len(ids) > 20

    # when: it is exported
    call_command("campaign", "export", campaign.name, "--to", str(tmp_path / "out"))

    # then: the table beside the matrix holds the same rows, in import order
    path = tmp_path / "out" / f"vectors-{version.label}.parquet"
    frame = pd.read_parquet(path)
    matrix = np.load(tmp_path / "out" / f"vectors-{version.label}.npy")
    assert list(frame.columns) == ["id", "row", "version", "vector", "error"]
    assert frame["id"].tolist() == ids
    assert frame["row"].tolist() == list(range(len(ids)))
    assert set(frame["version"]) == {version.number}
    assert (frame["error"] == "").all()
    assert np.array_equal(np.stack(frame["vector"].to_numpy()), matrix)
    with open(tmp_path / "out" / f"vectors-{version.label}.csv") as fh:
        assert [r["id"] for r in csv.DictReader(fh)] == ids
    # a fixed-length float32 list, which `datasets` and polars read as an array column
    schema = pq.read_schema(path)
    assert schema.field("vector").type == pa.list_(pa.float32(), 384)
    meta = {k.decode(): json.loads(v) for k, v in schema.metadata.items() if k != b"ARROW:schema"}
    assert meta["version"] == version.label and meta["campaign"] == campaign.name
    assert meta["dimension"] == 384 and "import order" in meta["order"]

    # and the versions section offers the same table to download
    client.force_login(owner)
    page = client.get(reverse("campaign_versions", args=[campaign.name])).content.decode()
    assert 'data-download="vectors.parquet"' in page
    downloaded = pd.read_parquet(io.BytesIO(_download(client, campaign, 1, "vectors.parquet")))
    assert downloaded["id"].tolist() == ids
    assert np.array_equal(np.stack(downloaded["vector"].to_numpy()), matrix)


def test_an_unreadable_output_is_a_null_vector_with_its_reason(
    make_campaign, output_root, run_here, client, owner, tmp_path
):
    campaign = make_campaign("lost", batch_size=4)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    label = campaign.current_version.label
    shard = sorted((output_root / campaign.name / label).rglob("*.npz"))[0]
    shard.unlink()

    export(campaign, tmp_path / "out")
    frame = pd.read_parquet(tmp_path / "out" / f"vectors-{label}.parquet")
    matrix = np.load(tmp_path / "out" / f"vectors-{label}.npy")
    lost = frame["vector"].isna().to_numpy()
    assert 0 < lost.sum() < len(frame)
    # the same rows as the matrix's NaN rows, each with the reason
    assert np.array_equal(lost, np.isnan(matrix).all(axis=1))
    assert frame.loc[lost, "error"].str.startswith("output unreadable: ").all()
    assert (frame.loc[~lost, "error"] == "").all()
    assert frame["id"].tolist() == _done_ids(campaign)

    client.force_login(owner)
    downloaded = pd.read_parquet(io.BytesIO(_download(client, campaign, 1, "vectors.parquet")))
    assert downloaded["vector"].isna().tolist() == lost.tolist()


def test_a_classifiers_table_holds_labels_probabilities_and_features(
    user_model,  # noqa: F811 (the imported fixture)
    shapes,  # noqa: F811 (the imported fixture)
    project,
    output_root,
    run_here,
    client,
    owner,
    tmp_path,
):
    # given: three classes, two of them ranked per image (top_k 2)
    campaign, _ = setup.campaign_create(
        name="shapes",
        processor="image-classification",
        project=project,
        input_folder=shapes,
        params=classifier_params(user_model, batch_size=8, top_k=2),
    )
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    version = campaign.current_version
    ids = _done_ids(campaign)
    assert len(ids) == 30

    written = {p.name for p in export(campaign, tmp_path / "out")}
    assert f"predictions-{version.label}.parquet" in written
    path = tmp_path / "out" / f"predictions-{version.label}.parquet"
    frame = pd.read_parquet(path)
    features = np.load(tmp_path / "out" / f"features-{version.label}.npy")
    with open(tmp_path / "out" / f"predictions-{version.label}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))

    assert frame["id"].tolist() == ids == [r["id"] for r in rows]
    assert set(frame["version"]) == {version.number}
    assert frame["label"].tolist() == [r["label_1"] for r in rows]
    assert np.array_equal(np.stack(frame["features"].to_numpy()), features)
    schema = pq.read_schema(path)
    assert json.loads(schema.metadata[b"classes"]) == CLASSES
    assert schema.field("probabilities").type == pa.list_(pa.float32(), 3)
    for cells, row in zip(frame.itertuples(), rows, strict=True):
        probabilities = np.asarray(cells.probabilities, dtype=np.float64)
        # each ranked class at its place in the labels file; the one not ranked is null
        for rank in (1, 2):
            place = CLASSES.index(row[f"label_{rank}"])
            assert probabilities[place] == pytest.approx(
                float(row[f"probability_{rank}"]), abs=1e-5
            )
        assert np.isnan(probabilities).sum() == 1
        assert cells.probability == pytest.approx(float(row["probability_1"]), abs=1e-5)
        assert cells.margin == pytest.approx(float(row["margin"]), abs=1e-5)

    # The page's download is the same table.
    client.force_login(owner)
    downloaded = pd.read_parquet(io.BytesIO(_download(client, campaign, 1, "predictions.parquet")))
    assert downloaded["id"].tolist() == ids
    assert downloaded["label"].tolist() == frame["label"].tolist()

    # A labels file changed since the version was made: the classes are what
    # the outputs named, in the same places.
    (user_model[1]).write_text("a\nb\nc\n")
    export(campaign, tmp_path / "again")
    again = pq.read_schema(tmp_path / "again" / f"predictions-{version.label}.parquet")
    assert json.loads(again.metadata[b"classes"]) == CLASSES


def test_a_large_table_is_written_a_row_group_at_a_time(
    project, output_root, tmp_path, client, owner, monkeypatch
):
    """The rows go out a row group at a time: the memory the export and the
    download take (Python's and numpy's as tracemalloc sees them, Arrow's
    from its pool) peaks far below the table's size."""
    from tests.campaigns.test_records import create, write_jsonl

    # given: 6,000 records with 384-value vectors (9 MB of float32), made without a model
    n, dimension = 6000, 384
    records = write_jsonl(
        tmp_path / "large.jsonl", [{"id": f"r{i:05d}", "text": f"row {i}"} for i in range(n)]
    )
    campaign, report = create(project, records, name="large")
    assert report.created == n
    vectors = _fabricate_outputs(campaign, dimension)
    total = vectors.nbytes
    monkeypatch.setattr(tables, "ROW_GROUP_BYTES", 64 << 10)
    monkeypatch.setattr(matrices, "_CHUNK", 250)
    monkeypatch.setattr("campaigns.runs.versions._CHUNK", 250)

    # Arrow's memory, read each time a row group is put together
    pool = pa.default_memory_pool()
    arrow_peak = 0
    real = tables.pa.record_batch

    def watched(*args, **kwargs):
        nonlocal arrow_peak
        batch = real(*args, **kwargs)
        arrow_peak = max(arrow_peak, pool.bytes_allocated())
        return batch

    monkeypatch.setattr(tables.pa, "record_batch", watched)

    # when: its matrix, rows and table are exported
    (tmp_path / "out").mkdir()
    tracemalloc.start()
    try:
        consolidate_vectors(campaign, tmp_path / "out")
        _, export_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # and the table downloaded from the versions section, the chunks written
    # to a file as they come
    client.force_login(owner)
    page = client.get(reverse("campaign_versions", args=[campaign.name])).content.decode()
    url = reverse("version_download", args=[campaign.name, 1, "vectors.parquet"])
    assert f'href="{url}"' in page
    downloaded = tmp_path / "downloaded.parquet"
    tracemalloc.start()
    try:
        with open(downloaded, "wb") as fh:
            for chunk in client.get(url).streaming_content:
                fh.write(chunk)
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # then: both hold every row, in import order, a row group at a time
    label = campaign.current_version.label
    for path in (tmp_path / "out" / f"vectors-{label}.parquet", downloaded):
        meta = pq.ParquetFile(path).metadata
        assert meta.num_rows == n and meta.num_row_groups >= n // 100
        frame = pd.read_parquet(path)
        assert frame["id"].tolist() == [f"r{i:05d}" for i in range(n)]
        assert np.array_equal(np.stack(frame["vector"].to_numpy()), vectors)
    assert 0 < arrow_peak < total / 10, (arrow_peak, total)
    assert export_peak < total / 3, (export_peak, total)
    assert download_peak < total / 3, (download_peak, total)


def _fabricate_outputs(campaign, dimension: int) -> np.ndarray:
    """Shards, batches, attempts and unit rows for every unit, as a worker
    records them (bench/versions_scale.py's way); returns the vectors in
    unit order."""
    from django.conf import settings
    from django.utils import timezone

    from campaigns.db.row_updates import update_rows
    from campaigns.models import Attempt, Batch
    from campaigns.storage.vector_shards import member_path, shard_bytes

    version = campaign.current_version
    root = settings.OUTPUT_ROOT
    ids = list(Unit.objects.filter(campaign=campaign).order_by("pk").values_list("pk", "uid"))
    vectors = np.random.default_rng(0).standard_normal((len(ids), dimension)).astype("<f4")
    now = timezone.now()
    attempts, results = [], []
    for start in range(0, len(ids), 64):  # a batch of 64 a shard, as a worker writes them
        rows = ids[start : start + 64]
        batch = Batch.objects.create(
            campaign=campaign, version=version, size=len(rows), state="done"
        )
        rel = f"{campaign.name}/{version.label}/shards/b{batch.pk}.npz"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        block = vectors[start : start + len(rows)]
        (root / rel).write_bytes(shard_bytes([uid for _, uid in rows], block))
        for row, (pk, _uid) in enumerate(rows):
            path = member_path(rel, row)
            attempts.append(
                Attempt(
                    unit_id=pk,
                    batch=batch,
                    version=version,
                    outcome="succeeded",
                    output_path=path,
                    output_size=dimension * 4,
                    started_at=now,
                    finished_at=now,
                    duration_ms=1,
                )
            )
            results.append((pk, UnitState.SUCCEEDED, batch.pk, path))
    Attempt.objects.bulk_create(attempts, batch_size=2000)
    update_rows(Unit, ("state", "batch", "output_path"), results, also={})
    return vectors
