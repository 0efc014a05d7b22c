"""`campaign run` over a million pending units at scale: batches/s.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/helper_import \\
        .venv/bin/python bench/run_scale.py --units 1000000 [--old]

Imports --units trusted rows (bench/import_scale.py's manifest) into a fresh
campaign with batch_policy=original, then times start.campaign_run with
the broker send mocked out (sending is the broker's cost, not ours). --old
also times the previous loop (one Batch INSERT and one UPDATE per batch) on
the same units first, then puts them back to pending. --policy token_budget
times the weighing of every unit (costs.measure_costs) before the run;
with --weigh-in-run the run weighs them itself, as `campaign run` does; with
--first-group the run stops at the default checkpoint, and weighs only the
units it sends. Each run says when its first batch was sent. The campaign is
deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def old_run(campaign, batching, Batch, Unit, UnitState, transaction) -> int:
    """A batch INSERT and a claiming UPDATE per batch, the loop `--old` compares with."""
    version = campaign.current_version
    policy = batching.batch_policy(version.params)
    pending_units = Unit.objects.filter(campaign=campaign, state=UnitState.PENDING)
    created = []
    with transaction.atomic():
        pending = list(pending_units.order_by("pk").values_list("pk", "cost"))
        for ids in batching.plan_batches(pending, version.params):
            batch = Batch.objects.create(
                campaign=campaign, version=version, size=len(ids), policy=policy
            )
            claimed = Unit.objects.filter(pk__in=ids, state=UnitState.PENDING).update(
                state=UnitState.QUEUED, batch=batch
            )
            if claimed != len(ids):
                batch.size = claimed
                batch.save(update_fields=["size"])
            created.append(batch.pk)
    return len(created)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--old", action="store_true", help="also time the previous loop")
    parser.add_argument(
        "--policy",
        default="original",
        choices=("original", "token_budget"),
        help="token_budget: the run first weighs every unit (costs.measure_costs), "
        "timed apart; the manifest's files do not exist, so each weighs 1 after a failed read",
    )
    parser.add_argument(
        "--weigh-in-run",
        action="store_true",
        help="with --policy token_budget: no separate measure_costs, the run weighs as it plans",
    )
    parser.add_argument(
        "--first-group",
        action="store_true",
        help="the default checkpoint (1 %% of the units, at least 200, and the holdout): "
        "the run sends, and weighs, only that first group",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-run-"))
    os.environ.update(
        {
            "VAR_DIR": str(work / "var"),
            "OUTPUT_ROOT": str(work / "outputs"),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from import_scale import write_manifest

    from campaigns.intake.importing import import_manifest
    from campaigns.models import Batch, Campaign, Unit, UnitState
    from campaigns.runs import batching, costs, setup, start

    call_command("migrate", verbosity=0)
    manifest = work / "manifest.jsonl"
    write_manifest(manifest, args.units, "jsonl")
    (work / "empty.jsonl").write_text("")
    campaign, _ = setup.campaign_create(
        name=f"bench-run-{os.getpid()}",
        processor="text-embedding",
        project=setup.project_for_user(name="bench"),
        manifest=work / "empty.jsonl",
        input_root=work / "corpus",
        checkpoint_after=None if args.first_group else 0,
        params={"batch_policy": args.policy},
    )
    print(f"{connection.vendor}, {args.units:,} units, batch_size 16, policy {args.policy}")
    try:
        started = time.perf_counter()
        import_manifest(campaign, manifest)
        print(f"import: {time.perf_counter() - started:.1f} s")
        campaign.refresh_from_db()
        first_send: list[float] = []

        def send(*_args, **_kwargs) -> None:
            if not first_send:
                first_send.append(time.perf_counter())

        with mock.patch.object(start.celery_app, "send_task", side_effect=send):
            if args.old:
                started = time.perf_counter()
                n = old_run(campaign, batching, Batch, Unit, UnitState, transaction)
                seconds = time.perf_counter() - started
                rate = args.units / seconds
                print(f"old loop: {n:,} batches in {seconds:.1f} s ({rate:,.0f} units/s)")
                Unit.objects.filter(campaign=campaign).update(state=UnitState.PENDING, batch=None)
                Batch.objects.filter(campaign=campaign)._raw_delete(connection.alias)
            if args.policy != "original" and not (args.first_group or args.weigh_in_run):
                started = time.perf_counter()
                params = campaign.current_version.params
                weighed = costs.measure_costs(campaign=campaign, params=params)
                seconds = time.perf_counter() - started
                print(f"measure_costs: {weighed:,} units in {seconds:.1f} s")
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            first_send.clear()
            started = time.perf_counter()
            n = start.campaign_run(campaign=campaign)
            seconds = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rate = args.units / seconds
        print(
            f"campaign_run: {n:,} batches in {seconds:.1f} s ({rate:,.0f} units/s), "
            f"peak RSS {peak:.0f} MiB (before {rss:.0f}); "
            f"first batch sent after {first_send[0] - started:.1f} s"
        )
        queued = Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count()
        weighed = Unit.objects.filter(campaign=campaign, cost__isnull=False).count()
        print(f"queued {queued:,} units, {weighed:,} weighed")
        assert queued == args.units or args.first_group
    finally:
        Unit.objects.filter(campaign=campaign)._raw_delete(connection.alias)
        Batch.objects.filter(campaign=campaign)._raw_delete(connection.alias)
        Campaign.objects.filter(pk=campaign.pk).delete()


if __name__ == "__main__":
    main()
