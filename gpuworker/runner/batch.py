"""Run one batch: claim it, read inputs, run the processor, write, validate, record.

Every unit of the batch ends succeeded or failed with a class and a readable
reason; one bad input never stops the others. The phases are the modules of
gpuworker/runner/ (its __init__ lists them).
"""

from __future__ import annotations

from campaigns.db.batch_statements import batch_to_run
from campaigns.models import Batch
from common.log_context import bound
from gpuworker.runner.claim import batch_claim
from gpuworker.runner.pipeline import BatchRun, finisher


def run_batch(batch_id: int, *, hand_off: bool = False) -> str:
    """Run one batch; returns "done", "lease lost", "not runnable", "gone", or,
    with `hand_off`, "handed off".

    `hand_off` (the Celery task, settings.BATCH_PIPELINE) returns once the model
    has run: writing the outputs, recording and the checkpoint checks go to the
    process's finisher thread, so they overlap the next batch's reads and model
    instead of leaving the device idle. The batch keeps its lease until it is
    recorded; if the process dies first, the lease runs out, the sweeper
    requeues the batch, and its outputs already written are adopted.
    """
    batch = batch_to_run(batch_id)
    if batch is None:
        return "gone"
    # Every line logged while this batch runs names it and its campaign.
    with bound(campaign=batch.campaign_id, batch=batch_id):
        return _run_claimed(batch, hand_off=hand_off)


def _run_claimed(batch: Batch, *, hand_off: bool = False) -> str:
    claimed = batch_claim(batch)
    if claimed is None:
        return "not runnable"
    run = BatchRun(batch, *claimed)
    run.lease.start()
    try:
        run.compute(prefetch_next=hand_off)
    except BaseException:
        run.lease.stop()
        raise
    if hand_off:
        finisher.submit(run)
        return "handed off"
    return run.finish()
