"""A user's own processor whose time and memory are known in advance: the
profiler's tests measure it instead of real hardware.

Each batch sleeps `ms_per_batch` plus `us_per_token` × its padded tokens
(items × the longest item's words, as a padding encoder computes): an
estimate can be checked against a real run without timing a CPU, and on a
loaded machine the sleeps, not the computing, set the times.

`fail_on` makes a batch holding a text with that word raise, as a model
error on one input would.

`leak_mib` keeps that many MiB of real (written, so resident) memory in a
module-level list on every `leak_every`-th batch, as a processor that holds
on to its batches (a cache, a list of last outputs) would. `KEPT.clear()`
gives it back.

Registered in tests through the BRIEFGPU_PROCESSORS setting, as
tests/plugins/text_stats.py is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from campaigns.intake.inputs import decode_text
from campaigns.specs.processors import ParamSpec, ProcessorSpec
from campaigns.storage.outputs import InvalidOutput

MiB = 1024 * 1024
KEPT: list[np.ndarray] = []


def words(text: str) -> int:
    return max(1, len(text.split()))


def _cost(path: Path, params: dict) -> int:
    return words(path.read_bytes().decode("utf-8", errors="replace"))


def _deep_check(path: Path, params: dict) -> None:
    if not path.read_bytes().strip():
        raise InvalidOutput("empty output")


SPEC = ProcessorSpec(
    name="paced-text",
    title="Paced text (tests)",
    help="Upper-cases each text, taking a known time per padded word.",
    output_suffix=".txt",
    implementation="tests.plugins.paced_text:PacedText",
    takes_text=True,
    padding="longest",
    params={
        "batch_size": ParamSpec(8, type=int, minimum=1),
        "batch_policy": ParamSpec(
            "length_grouped", choices=("original", "length_grouped", "token_budget")
        ),
        "token_budget": ParamSpec(4096, type=int, minimum=1),
        "us_per_token": ParamSpec(0, type=int, minimum=0, help="sleep per padded word"),
        "ms_per_batch": ParamSpec(0, type=int, minimum=0, help="sleep per batch"),
        "leak_mib": ParamSpec(0, type=int, minimum=0, help="MiB kept per leaking batch"),
        "leak_every": ParamSpec(1, type=int, minimum=1, help="every n-th batch leaks"),
        "fail_on": ParamSpec("", help="a word: a batch holding a text with it raises"),
    },
    deep_check=_deep_check,
    cost=_cost,
)


class PacedText:
    suffix = ".txt"

    def __init__(self, params: dict):
        self.params = params
        self.batches = 0

    def prepare(self, data: bytes) -> tuple[str, int]:
        text = decode_text(data)
        return text, words(text)

    def run(self, items: list[tuple[str, int]]) -> list[tuple[str, int]]:
        refused = self.params["fail_on"]
        if refused and any(refused in text.split() for text, _ in items):
            raise RuntimeError(f"the model cannot take {refused!r}")
        padded = len(items) * max(count for _, count in items)
        time.sleep(self.params["ms_per_batch"] / 1e3 + self.params["us_per_token"] * padded / 1e6)
        self.batches += 1
        if self.params["leak_mib"] and self.batches % self.params["leak_every"] == 0:
            KEPT.append(np.ones(self.params["leak_mib"] * MiB, dtype=np.uint8))
        return [(text.upper(), count) for text, count in items]

    def output(self, result: list, index: int) -> tuple[str, int]:
        return result[index]

    def serialize(self, record: tuple[str, int]) -> bytes:
        return record[0].encode()

    def validate(self, path: Path) -> None:
        _deep_check(path, self.params)

    def unit_metrics(self, result: list, index: int) -> dict:
        return {"words": result[index][1]}

    def batch_metrics(self, result: list) -> dict:
        counts = [count for _, count in result]
        return {"real_tokens": sum(counts), "padded_tokens": len(counts) * max(counts)}


if TYPE_CHECKING:
    # mypy checks the class against the runner's interface (docs/processors.md).
    from gpuworker.processors.base import ProcessorClass

    _CHECK: ProcessorClass = PacedText
