"""What a training spends besides its steps: a checkpoint write every
`checkpoint_every` steps (and at the last), and a held-out evaluation at each
checkpoint and once of the base model before the first step.

A training estimate that counts only steps × seconds a step falls short by
all of that, most with a small model, frequent checkpoints or a large
held-out set. Measured from this campaign's own trainings when one has
recorded them (the worker times each checkpoint's evaluation and write:
gpuworker/training_tasks.py); else estimated from the model's size and the
held-out set's, and the estimate says which figures it assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from campaigns.models import Campaign, ModelCheckpoint

#: Bytes a second a checkpoint is written at when none was timed: the weights
#: and the optimizer's states written, synced and checksummed (a local SSD
#: writes faster; a network disk, slower).
ASSUMED_WRITE_BYTES_PER_S = 100 * 1000 * 1000
#: A held-out example's forward pass, as a share of the time a training step
#: spends on an example (forward, backward, optimizer), when none was timed.
ASSUMED_FORWARD_SHARE = 1 / 3


@dataclass(frozen=True)
class TrainingOverhead:
    checkpoints: int
    evaluations: int
    write_s: float  # one checkpoint
    eval_s: float  # one evaluation of the held-out set
    reasons: list[str]

    @property
    def write_seconds(self) -> float:
        return self.checkpoints * self.write_s

    @property
    def eval_seconds(self) -> float:
        return self.evaluations * self.eval_s


def training_overhead(
    *,
    campaign: Campaign,
    steps: int,
    checkpoint_every: int,
    heldout: int,
    step: dict[str, Any],
) -> TrainingOverhead:
    """The checkpoint writes and held-out evaluations of a training of `steps`
    optimizer steps, `step` being the profile's measured training step at the
    chosen size (its batch_size, step_s, and the weights' and optimizer
    states' bytes)."""
    checkpoints = math.ceil(steps / max(1, checkpoint_every)) if steps else 0
    # Each checkpoint's, and the base model's before the first step.
    evaluations = checkpoints + 1 if heldout else 0
    size = int(step.get("weights") or 0) + int(step.get("optimizer") or 0)
    write_s = size / ASSUMED_WRITE_BYTES_PER_S
    per_example = float(step["step_s"]) / max(1, int(step["batch_size"])) * ASSUMED_FORWARD_SHARE
    timed = _timed(campaign)
    reasons = []
    if timed is not None and timed[0].get("write_s") is not None:
        write_s = float(timed[0]["write_s"])
        reasons.append(
            f"a checkpoint write as timed by training {timed[1]} of this campaign ({write_s:.2f} s)"
        )
    else:
        reasons.append(
            "no training of this campaign has timed a checkpoint yet: a checkpoint is assumed "
            f"to be the weights and optimizer states ({size / 1e6:,.0f} MB) written, synced "
            f"and checksummed at {ASSUMED_WRITE_BYTES_PER_S / 1e6:.0f} MB/s"
        )
    if timed is not None and timed[0].get("heldout"):
        per_example = float(timed[0]["heldout_eval_s"]) / int(timed[0]["heldout"])
        reasons.append(
            f"a held-out example's evaluation as timed by training {timed[1]} "
            f"({per_example * 1000:.1f} ms)"
        )
    elif heldout:
        reasons.append(
            "no training of this campaign has timed a held-out evaluation yet: an example's "
            "forward pass is assumed to take a third of a training step's time an example "
            f"({per_example * 1000:.1f} ms)"
        )
    eval_s = per_example * heldout
    reasons.append(
        f"{checkpoints} checkpoint write(s) (one every {checkpoint_every} steps and the last) "
        f"≈ {checkpoints * write_s:.1f} s, and {evaluations} held-out evaluation(s) of "
        f"{heldout} examples (each checkpoint's and the base model's) ≈ "
        f"{evaluations * eval_s:.1f} s, included in the hours"
    )
    return TrainingOverhead(
        checkpoints=checkpoints,
        evaluations=evaluations,
        write_s=write_s,
        eval_s=eval_s,
        reasons=reasons,
    )


def _timed(campaign: Campaign) -> tuple[dict[str, Any], int] | None:
    """The newest checkpoint timings a training of this campaign recorded, and
    that training's id; None before any (or only checkpoints from before the
    worker timed them)."""
    for linkage, training in (
        ModelCheckpoint.objects.filter(training__campaign=campaign)
        .order_by("-created_at", "-pk")
        .values_list("linkage", "training_id")[:20]
    ):
        timings = (linkage or {}).get("timings")
        if timings:
            return timings, training
    return None
