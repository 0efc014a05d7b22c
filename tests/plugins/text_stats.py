"""A user's own processor, as docs/processors.md shows it: no torch needed.

It counts characters, words and lines of each text and writes them as JSON.
Registered in tests through the BRIEFGPU_PROCESSORS setting; a package would
use the `briefgpu.processors` entry point instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from campaigns.intake.inputs import decode_text
from campaigns.specs.processors import ParamSpec, ProcessorSpec
from campaigns.storage.outputs import InvalidOutput


def _check(path: Path, expected_size: int | None, params: dict) -> None:
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        raise InvalidOutput(f"size {size}, recorded {expected_size}")


def _deep_check(path: Path, params: dict) -> None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidOutput(f"not JSON: {exc}") from exc
    if set(record) != {"chars", "words", "lines"}:
        raise InvalidOutput(f"fields {sorted(record)}, expected chars, words, lines")


def _cost(path: Path, params: dict) -> int:
    return max(1, path.stat().st_size)


SPEC = ProcessorSpec(
    name="text-stats",
    title="Text statistics",
    help="Characters, words and lines of each text.",
    output_suffix=".json",
    implementation="tests.plugins.text_stats:TextStats",
    takes_text=True,
    params={
        "batch_size": ParamSpec(8, type=int, minimum=1),
        "batch_policy": ParamSpec("original", choices=("original", "length_grouped")),
        "lowercase": ParamSpec("no", choices=("yes", "no"), help="count words case-blind"),
    },
    quick_check=_check,
    deep_check=_deep_check,
    cost=_cost,
)


class TextStats:
    suffix = ".json"

    def __init__(self, params: dict):
        self.params = params

    def prepare(self, data: bytes) -> str:
        return decode_text(data)

    def run(self, items: list[str]) -> list[dict]:
        return [
            {"chars": len(t), "words": len(t.split()), "lines": t.count("\n") + 1} for t in items
        ]

    def output(self, result: list[dict], index: int) -> dict:
        return result[index]

    def serialize(self, record: dict) -> bytes:
        return json.dumps(record, sort_keys=True).encode()

    def validate(self, path: Path) -> None:
        _deep_check(path, self.params)

    def unit_metrics(self, result: list[dict], index: int) -> dict:
        return {"words": result[index]["words"]}

    def batch_metrics(self, result: list[dict]) -> dict:
        return {"real_tokens": sum(r["words"] for r in result)}


if TYPE_CHECKING:
    # mypy checks the class against the runner's interface (docs/processors.md).
    from gpuworker.processors.base import ProcessorClass

    _CHECK: ProcessorClass = TextStats
