"""A text-generation campaign's completions gathered, one table per parameter
version: `completions-<version>.jsonl` (a JSON object a line) and
`completions-<version>.parquet` (the same rows, for pandas, polars or
`datasets`), rows in unit (import) order.

Each unit's output (a line of its batch's JSON row shard, or a file of its
own) is read once, checked as verify checks it
(campaigns/specs/generation.read_completion_at), a row group at a time: the
export holds GROUP_ROWS completions and a few batches' shards at most,
whatever the corpus's size. An
output that cannot be read (deleted or damaged since) keeps its row with
empty cells and the reason in `error`; the rest goes on.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from campaigns.exports import tables
from campaigns.models import Campaign, ParameterVersion
from campaigns.runs.versions import outputs_count, outputs_of
from campaigns.specs.generation import completion_reader, read_completion_at
from campaigns.storage.outputs import InvalidOutput, write_atomic

GENERATION = "text-generation"
#: Completions a Parquet row group holds at most, and their text's bytes: a
#: completion is up to max_new_tokens tokens (megabytes at 32,768), so a
#: group also ends at GROUP_BYTES.
GROUP_ROWS = 2048
GROUP_BYTES = 16 << 20
#: What a version offers for download.
DOWNLOADS = ("completions.jsonl", "completions.parquet")

_FIELDS = ("completion", "finish_reason", "prompt_tokens", "completion_tokens")


def completion_schema(campaign: Campaign, version: ParameterVersion) -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("row", pa.int64()),
            ("version", pa.int32()),
            ("source_path", pa.string()),
            ("completion", pa.string()),
            ("finish_reason", pa.string()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("error", pa.string()),
        ],
        metadata={
            key: json.dumps(value)
            for key, value in {
                "campaign": campaign.name,
                "processor": campaign.processor,
                "version": version.label,
                "order": "unit import order",
            }.items()
        },
    )


def completion_rows(campaign: Campaign, version: ParameterVersion, count: int) -> Iterator[dict]:
    """Each unit's row (without `row` and `version`), in unit order; units
    done after the count was taken wait for the next export."""
    reader = completion_reader(version.params)
    for out in itertools.islice(outputs_of(campaign=campaign, version=version), count):
        cells: dict[str, Any] = {"id": out.uid, "source_path": out.source_path, "error": ""}
        try:
            record = read_completion_at(reader, out.output_path, version.params, out.uid)
        except (OSError, InvalidOutput) as exc:
            cells.update(dict.fromkeys(_FIELDS), error=f"output unreadable: {exc}")
        else:
            cells.update(record)
        yield cells


def _grouped(rows: Iterator[dict], table: tables.TableWriter) -> Iterator[dict]:
    """`rows`, the table's group written whenever its completions reach GROUP_BYTES."""
    held = 0
    for cells in rows:
        size = len(cells.get("completion") or "")
        if held and held + size > GROUP_BYTES:
            table.flush()
            held = 0
        held += size
        yield cells


def _line(row: int, version: ParameterVersion, cells: dict) -> str:
    ordered = {"id": cells["id"], "row": row, "version": version.number, **cells}
    return json.dumps(ordered, ensure_ascii=False) + "\n"


def completions_jsonl(campaign: Campaign, version: ParameterVersion) -> Iterator[str]:
    count = outputs_count(campaign=campaign, version=version)
    for row, cells in enumerate(completion_rows(campaign, version, count)):
        yield _line(row, version, cells)


def completions_parquet(campaign: Campaign, version: ParameterVersion) -> tables.Download | None:
    """The version's table as Parquet bytes, a row group at a time; None without outputs."""
    count = outputs_count(campaign=campaign, version=version)
    if not count:
        return None
    return tables.Download(
        filename=f"{campaign.name}-completions-{version.label}.parquet",
        body=_parquet_bytes(campaign, version, count),
    )


def _parquet_bytes(campaign: Campaign, version: ParameterVersion, count: int) -> Iterator[bytes]:
    sink = tables.Chunks()
    table = tables.TableWriter(sink, completion_schema(campaign, version), count, GROUP_ROWS)
    for row, cells in enumerate(_grouped(completion_rows(campaign, version, count), table)):
        table.add(row=row, version=version.number, **cells)
        if chunk := sink.take():
            yield chunk
    table.close()
    yield sink.take()


def export_completions(campaign: Campaign, folder: Path) -> list[Path]:
    """completions-<version>.jsonl and .parquet for each version with outputs, in one pass."""
    written = []
    for version in campaign.versions.order_by("number"):
        count = outputs_count(campaign=campaign, version=version)
        if not count:
            continue
        lines = folder / f"completions-{version.label}.jsonl"
        table_path = folder / f"completions-{version.label}.parquet"
        with tables.atomic_file(table_path) as sink:
            table = tables.TableWriter(
                sink, completion_schema(campaign, version), count, GROUP_ROWS
            )

            def both(
                table: tables.TableWriter = table,
                version: ParameterVersion = version,
                count: int = count,
            ) -> Iterator[bytes]:
                rows = completion_rows(campaign, version, count)
                for row, cells in enumerate(_grouped(rows, table)):
                    table.add(row=row, version=version.number, **cells)
                    yield _line(row, version, cells).encode("utf-8")

            write_atomic(lines, both())
            table.close()
        written += [lines, table_path]
    return written
