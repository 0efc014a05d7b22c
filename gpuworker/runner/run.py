"""The model's part of a batch: its inputs prepared, then `run` over them,
split in halves while the device runs out of memory."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch
from django.conf import settings

from campaigns.intake.inputs import corpus_real_path
from campaigns.intake.project_folders import campaign_folder_refusal
from campaigns.models import Batch, ErrorClass
from campaigns.runs.memory_errors import alone_message
from campaigns.specs.processors import get_spec
from campaigns.storage.paths import output_relpath
from gpuworker.memory import at_failure
from gpuworker.processors import shard_written
from gpuworker.processors.base import Processor
from gpuworker.runner.check import adoption_for
from gpuworker.runner.claim import Outcome
from gpuworker.runner.prefetch import prefetch
from gpuworker.runner.read import SKIP, prepare_ahead, prepare_unit, rows_of
from gpuworker.runner.threads import in_threads, worth_threads

# The units that went through one `run` call, each with its prepared input, and
# that call's result.
Part = tuple[list[tuple[Outcome, Any]], Any]


def compute(
    batch: Batch, processor: Processor, outcomes: list[Outcome], *, prefetch_next: bool = False
) -> tuple[list[Part], int, list[int]]:
    """Read and prepare the inputs, run the model: (parts, adopted, OOM splits).

    With `prefetch_next`, the next batch's inputs are prepared while the model runs.
    """
    ahead = prefetch.take(batch.pk)  # what was prepared while the last batch ran
    root = Path(batch.campaign.input_root)
    real_root = corpus_real_path(root)  # once a batch, not once an input
    # Checked again here, as at import and run, on the real path every read
    # of this batch is held to: a batch queued before the campaign's folder
    # was swapped for a symlink (or taken from its project) reads nothing from
    # it. Its units fail with the reason; once the folder is right again,
    # resume --retry-failed runs them.
    refusal = campaign_folder_refusal(batch.campaign, real=real_root)
    if refusal is not None:
        for outcome in outcomes:
            outcome.fail(ErrorClass.INPUT_UNREADABLE, refusal)
        return [], 0, []
    output_root = Path(settings.OUTPUT_ROOT)
    if not shard_written(processor):
        for outcome in outcomes:
            outcome.target = str(
                output_relpath(
                    campaign=batch.campaign.name,
                    version_label=batch.version.label,
                    uid=outcome.unit.uid,
                    suffix=processor.suffix,
                )
            )
            outcome.path = output_root / outcome.target
    # Only a batch delivered again (its worker died before recording) looks.
    adoption = adoption_for(batch, processor)
    # A text only as far as the model uses it, the rest hashed as it streams by.
    limits = dataclasses.replace(
        get_spec(batch.campaign.processor).input_limits(batch.version.params), digest=True
    )
    # A record campaign's rows are read first, each record file opened once;
    # those the prefetch prepared are not read again here.
    rows = rows_of(
        root,
        real_root,
        [(o.unit.pk, o.unit.source_path) for o in outcomes if o.unit.pk not in ahead],
        limits,
    )
    # Reading and decoding in threads: file I/O and image decoding release
    # the GIL, so a slow disk or a large image does not serialise the batch
    # (the image transform bounds the decoded pixels they hold at once:
    # gpuworker/processors/pixel_budget.py). Small inputs are read in this
    # thread alone (threads.in_threads).
    prepared = in_threads(
        lambda o: prepare_unit(
            processor,
            root,
            real_root,
            o,
            adoption,
            ahead.get(o.unit.pk),
            limits,
            batch.campaign.name,
            rows.get(o.unit.pk),
        ),
        outcomes,
        threaded=worth_threads([0 if o.unit.pk in rows else o.unit.size for o in outcomes]),
    )
    ready = [(o, item) for o, item in zip(outcomes, prepared, strict=True) if item is not SKIP]
    adopted = sum(1 for o in outcomes if o.metrics.get("adopted"))
    splits: list[int] = []
    if prefetch_next:
        prefetch.start(
            batch, functools.partial(prepare_ahead, processor, root, real_root, limits=limits)
        )
    parts = run_splitting(processor, ready, splits) if ready else []
    return parts, adopted, splits


def run_splitting(
    processor: Processor,
    ready: list[tuple[Outcome, Any]],
    splits: list[int],
    tried: tuple[int, ...] = (),
) -> list[Part]:
    """Run the model; on device out-of-memory, split the batch in halves and retry.

    `splits` collects the sizes halved (the batch's `oom_splits`); `tried`,
    the sizes this part's units ran at before. A unit that does not fit even
    alone fails `out_of_memory` (a heavy case for review) with torch's message,
    the figures at the failure and the sizes it was tried at
    (campaigns/runs/memory_errors.py explains them); the rest of the batch goes on.
    """
    tried = (*tried, len(ready))
    try:
        return [(ready, processor.run([item for _, item in ready]))]
    except torch.OutOfMemoryError as exc:
        # Read here, while the failed pass's tensors still hold the device:
        # the figures at the failure, not after it.
        facts = at_failure(str(exc), tried=list(tried), alone=True) if len(ready) == 1 else None
    # Retried outside the except block: inside it the exception's traceback keeps
    # the failed forward pass's frames, and so its tensors, alive on the device.
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # give the halves the memory the failed try reserved
    if facts is not None:
        outcome = ready[0][0]
        outcome.fail(ErrorClass.OUT_OF_MEMORY, alone_message(facts["error"], tried))
        outcome.metrics["oom"] = facts
        return []
    splits.append(len(ready))
    middle = len(ready) // 2
    return run_splitting(processor, ready[:middle], splits, tried) + run_splitting(
        processor, ready[middle:], splits, tried
    )


#: A batch's figures that add up over its parts (a text generation's tokens too).
SUMMED_METRICS = (
    "real_tokens",
    "padded_tokens",
    "compute_seconds",
    "prompt_tokens",
    "generated_tokens",
)


def merge_batch_metrics(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One batch's measurements from its parts (more than one after an OOM split)."""
    if not parts:
        return {}
    merged = dict(parts[-1])
    for key in SUMMED_METRICS:
        if any(key in p for p in parts):
            merged[key] = sum(p.get(key, 0) for p in parts)
    memory = dict(parts[-1].get("memory", {}))
    for key in ("peak_allocated", "peak_reserved", "peak_rss"):
        values = [p.get("memory", {}).get(key) for p in parts]
        if any(v is not None for v in values):
            memory[key] = max(v for v in values if v is not None)
    merged["memory"] = memory
    return merged
