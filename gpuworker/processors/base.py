"""The interface the batch runner calls on a processor implementation.

A processor's spec (`campaigns.specs.processors.ProcessorSpec`) names its
implementation class; a worker makes one per parameter version as
`Class(params)` (`ProcessorClass`) and calls the methods below
(docs/processors.md says in which order and from which threads). The
built-ins and a user's own class satisfy `Processor` structurally, without
inheriting from it; gpuworker/processors/__init__.py checks the built-ins
statically, and loads an implementation as a `Processor`.

Parameters are positional-only here so that an implementation may name its
own (`serialize(self, vector)`, `serialize(self, record)`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from campaigns.storage.outputs import InvalidOutput, Streamed


class Processor(Protocol):
    """One loaded processor: the model of one parameter version."""

    #: Suffix of a unit's output file (".npy", ".png"); a class attribute, or
    #: set in `__init__` when the format is a parameter.
    suffix: str

    def prepare(self, data: bytes, /) -> Any:
        """One input's bytes decoded for `run`, or `InputError(class, reason)`.
        Called from several threads at once, and while `run` works on the last
        batch: it must not use an object that `run` changes. `data` is an
        `InputBytes`: its `source` reads the file again later (sha256
        checked), for a processor that lets go of a large input meanwhile."""
        ...

    def run(self, items: list[Any], /) -> Any:
        """One forward pass over the batch's prepared items; the result on the
        host (numpy, not device tensors). `torch.OutOfMemoryError` makes the
        runner split the batch and retry."""
        ...

    def output(self, result: Any, index: int, /) -> Any:
        """Item `index`'s output from `run`'s result."""
        ...

    def serialize(self, output: Any, /) -> bytes | Streamed:
        """An output as its file's bytes, or as a `Streamed` that writes them
        into the file as they are made (a large output's encoder: its bytes
        are then never all in memory)."""
        ...

    def validate(self, path: Path, /) -> None:
        """Raise `InvalidOutput` unless the file at `path` is a whole result."""
        ...

    def unit_metrics(self, result: Any, index: int, /) -> dict[str, Any]:
        """Item `index`'s measurements, kept on its attempt (tokens, truncated…)."""
        ...

    def batch_metrics(self, result: Any, /) -> dict[str, Any]:
        """The batch's measurements: real_tokens, padded_tokens, compute_seconds, memory."""
        ...


class FlaggingProcessor(Processor, Protocol):
    """A processor that puts some succeeded units in the review queue."""

    def flags(self, result: Any, index: int, /) -> list[tuple[str, str]]:
        """(reason, detail) of each review rule item `index` trips; [] for none."""
        ...


class ShardedProcessor(Processor, Protocol):
    """A processor whose outputs are 1-D float32 vectors written as one shard
    a batch (campaigns/storage/vector_shards.py) instead of a file a unit."""

    shard_outputs: bool

    def check_rows(self, vectors: Any, /) -> list[InvalidOutput | None]:
        """Each row's problem, or None: what `validate` checks of a file."""
        ...


class RowShardedProcessor(Processor, Protocol):
    """A processor whose outputs are JSON objects written as one JSON Lines
    shard a batch (campaigns/storage/row_shards.py) instead of a file a unit."""

    row_outputs: bool

    def row_record(self, output: Any, /) -> dict[str, Any]:
        """The unit's output as the fields of its shard line."""
        ...

    def check_record(self, record: dict[str, Any], /) -> InvalidOutput | None:
        """A row's problem as read back, or None: what `validate` checks of a file."""
        ...


#: How a worker makes a processor: the implementation class, given the
#: version's parameters.
ProcessorClass = Callable[[dict[str, Any]], Processor]
