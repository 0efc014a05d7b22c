"""A user's own processor on a device too small for it: the out-of-memory
tests run it instead of filling a real card.

A batch of more than `fits_units` texts, or holding a text of more than
`fits_words` words (after the `max_tokens` cut), raises a real
`torch.OutOfMemoryError` carrying the message the CUDA caching allocator
writes (MESSAGE: an 80 GB card, 75.30 GiB allocated by PyTorch, 1.10 GiB
reserved but unallocated, 1.20 GiB free). torch can raise it on a CPU, so
the runner splits the batch and records the failure as on a GPU.

`oom_in=unit_metrics` raises it while the outputs are taken from the result
instead (after the model's run, so no split can help): the runner fails the
batch's units `out_of_memory` without batch sizes tried.

Registered in tests through the BRIEFGPU_PROCESSORS setting, as
tests/plugins/text_stats.py is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from campaigns.intake.inputs import decode_text
from campaigns.specs.processors import ParamSpec, ProcessorSpec
from campaigns.storage.outputs import InvalidOutput

MESSAGE = (
    "CUDA out of memory. Tried to allocate {requested:.2f} GiB. GPU 0 has a total capacity "
    "of 79.15 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this process has "
    "77.95 GiB memory in use. Of the allocated memory 75.30 GiB is allocated by PyTorch, and "
    "1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
    "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


def words(text: str, params: dict) -> int:
    return max(1, min(len(text.split()), int(params["max_tokens"])))


def _cost(path: Path, params: dict) -> int:
    return words(path.read_bytes().decode("utf-8", errors="replace"), params)


def _deep_check(path: Path, params: dict) -> None:
    if not path.read_bytes().strip():
        raise InvalidOutput("empty output")


SPEC = ProcessorSpec(
    name="tight-memory",
    title="Tight memory (tests)",
    help="Upper-cases each text on a device that holds only small batches.",
    output_suffix=".txt",
    implementation="tests.plugins.tight_memory:TightMemory",
    takes_text=True,
    padding="longest",
    params={
        "batch_size": ParamSpec(8, type=int, minimum=1),
        "batch_policy": ParamSpec("original", choices=("original", "length_grouped")),
        "max_tokens": ParamSpec(512, type=int, minimum=1, help="words of a text the model sees"),
        "dtype": ParamSpec("float32", choices=("float32", "bfloat16")),
        "fits_units": ParamSpec(2, type=int, minimum=1, help="more texts a batch: out of memory"),
        "fits_words": ParamSpec(100, type=int, minimum=1, help="a longer text: out of memory"),
        "oom_in": ParamSpec("run", choices=("run", "unit_metrics")),
    },
    deep_check=_deep_check,
    cost=_cost,
    cost_params=("max_tokens",),
)


class TightMemory:
    suffix = ".txt"

    def __init__(self, params: dict):
        self.params = params

    def prepare(self, data: bytes) -> tuple[str, int]:
        text = decode_text(data)
        return text, words(text, self.params)

    def run(self, items: list[tuple[str, int]]) -> list[tuple[str, int]]:
        longest = max(count for _, count in items)
        if self.params["oom_in"] == "run" and (
            len(items) > self.params["fits_units"] or longest > self.params["fits_words"]
        ):
            self._out_of_memory(len(items) * longest)
        return [(text.upper(), count) for text, count in items]

    def _out_of_memory(self, padded_words: int) -> None:
        import torch  # only when it runs: the spec stays importable without torch

        raise torch.OutOfMemoryError(MESSAGE.format(requested=padded_words / 100))

    def output(self, result: list, index: int) -> tuple[str, int]:
        return result[index]

    def serialize(self, record: tuple[str, int]) -> bytes:
        return record[0].encode()

    def validate(self, path: Path) -> None:
        _deep_check(path, self.params)

    def unit_metrics(self, result: list, index: int) -> dict:
        if self.params["oom_in"] == "unit_metrics":
            self._out_of_memory(sum(count for _, count in result))
        return {"words": result[index][1]}

    def batch_metrics(self, result: list) -> dict:
        counts = [count for _, count in result]
        return {"real_tokens": sum(counts), "padded_tokens": len(counts) * max(counts)}


if TYPE_CHECKING:
    # mypy checks the class against the runner's interface (docs/processors.md).
    from gpuworker.processors.base import ProcessorClass

    _CHECK: ProcessorClass = TightMemory
