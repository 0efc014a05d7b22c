"""The `campaign` command's subcommands of adaptation campaigns
(docs/adaptation.md): `train`, `stop`, `checkpoints` and `use-checkpoint`."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import CommandError
from tqdm import tqdm

from campaigns.adaptation import services as adaptation
from campaigns.management.lookup import campaign_named
from campaigns.models import Campaign, Training
from campaigns.runs import start


def add_parsers(sub: Any) -> None:
    train = sub.add_parser(
        "train", help="train an adaptation campaign's current version (resumes a stopped one)"
    )
    train.add_argument("name")
    train.add_argument("--wait", action="store_true", help="follow it to the end")
    train.add_argument("--timeout", type=float, default=None)
    stop = sub.add_parser("stop", help="stop a training after its current step")
    stop.add_argument("name")
    listing_ckpt = sub.add_parser("checkpoints", help="an adaptation campaign's checkpoints")
    listing_ckpt.add_argument("name")
    listing_ckpt.add_argument("--json", action="store_true")
    use = sub.add_parser(
        "use-checkpoint",
        help="make a checkpoint the model of a new version of an inference campaign",
    )
    use.add_argument("name", help="the adaptation campaign")
    use.add_argument("step", type=int)
    use.add_argument("--into", required=True, help="the embedding or classification campaign")


class AdaptationCommands:
    """The subcommands' handlers, mixed into the `campaign` command."""

    stdout: Any
    stderr: Any

    def _training(self, campaign: Campaign) -> Training:
        training = Training.objects.filter(campaign=campaign).first()
        if training is None:
            raise CommandError(
                f"{campaign.name} has no training yet (campaign train {campaign.name})"
            )
        return training

    def _train(self, *, name, wait, timeout, **_):
        campaign = campaign_named(name)
        with start.broker_outage_noted() as outage:
            training = adaptation.training_start(campaign=campaign)
        version = training.version  # the campaign's current one, which training_start took
        self.stdout.write(
            f"training of version {version.number}: {training.state}"
            + (f", from step {training.step}" if training.step else "")
        )
        if outage:
            raise CommandError(start.broker_outage_reason(outage))
        if not wait:
            return
        started = time.monotonic()
        with tqdm(unit="step", desc=campaign.name, file=self.stderr._out) as bar:
            while training.state in adaptation.LIVE:
                if timeout is not None and time.monotonic() - started > timeout:
                    raise CommandError(
                        f"training still {training.state} after {timeout:g}s; is a worker running?"
                    )
                time.sleep(0.5)
                training.refresh_from_db()
                bar.total = training.total_steps or None
                bar.update(training.step - bar.n)
        self.stdout.write(
            f"{campaign.name}: training {training.state} at step {training.step} of "
            f"{training.total_steps}" + (f": {training.error}" if training.error else "")
        )
        if training.state == Training.State.FAILED:
            raise CommandError(training.error)

    def _stop(self, *, name, **_):
        training = adaptation.training_stop(training=self._training(campaign_named(name)))
        self.stdout.write(f"training {training.state} (step {training.step})")

    def _checkpoints(self, *, name, json: bool, **_):
        training = self._training(campaign_named(name))
        rows = [
            {
                "step": c.step,
                "state": c.state,
                "train_loss": c.train_loss,
                "heldout_loss": c.heldout_loss,
                "heldout_accuracy": c.heldout_accuracy,
                "path": c.path,
                "weights_sha256": c.weights_sha256,
                "base_model": c.linkage.get("base_model"),
                "data_sha256": c.linkage.get("data_sha256"),
                "problem": c.problem,
            }
            for c in training.checkpoints.all()
        ]
        if json:
            self.stdout.write(_dumps({"training": training.state, "checkpoints": rows}))
            return
        self.stdout.write(
            f"{name}: training {training.state}, step {training.step} of {training.total_steps}; "
            f"base {training.base_model} (held-out {_metrics(training.base_metrics)})"
        )
        for row in rows:
            self.stdout.write(
                f"  step {row['step']:>7}  {row['state']:<8} train loss {row['train_loss']:.4f}  "
                f"held-out {_metrics(row)}  {row['path']}"
                + (f"  ({row['problem']})" if row["problem"] else "")
            )

    def _use_checkpoint(self, *, name, step: int, into: str, **_):
        training = self._training(campaign_named(name))
        checkpoint = training.checkpoints.filter(step=step).first()
        if checkpoint is None:
            steps = ", ".join(str(c.step) for c in training.checkpoints.all()) or "none"
            raise CommandError(f"{name} has no checkpoint at step {step} (steps: {steps})")
        version = adaptation.checkpoint_use(checkpoint=checkpoint, target=campaign_named(into))
        self.stdout.write(
            f"{into}: version {version.number} ({version.label}) uses {name} step {step}; "
            f"campaign run {into} computes its outputs"
        )


def _metrics(values: dict) -> str:
    loss, accuracy = values.get("heldout_loss"), values.get("heldout_accuracy")
    if loss is None:
        return "not measured"
    return f"loss {loss:.4f}, accuracy {accuracy:.1%}"


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
