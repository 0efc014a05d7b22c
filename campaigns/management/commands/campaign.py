"""`python manage.py campaign create|import|run|checkpoint|list|status|…` (README.md)."""

from __future__ import annotations

import dataclasses
import json
import json as _json
import time
from contextlib import contextmanager
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from campaigns import selectors
from campaigns.adaptation import services as adaptation
from campaigns.exports.inventory import ExportError, export
from campaigns.intake import importing
from campaigns.intake.importing import ManifestError
from campaigns.intake.project_folders import covering, real_path
from campaigns.intake.records import RecordColumns, param_columns
from campaigns.management import adaptation_cli, folders_cli, verify_cli, version_cli
from campaigns.management.lookup import campaign_named
from campaigns.models import Campaign, Checkpoint
from campaigns.review.queue import checkpoint_decide, verification_status
from campaigns.runs import control, setup, start
from campaigns.runs.leases import BATCH_QUEUE, broker_queue_waiting
from campaigns.specs.processors import all_specs
from campaigns.watch import state as watch_state
from campaigns.watch import summary as watch_summary


def _param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise CommandError(f"--param takes KEY=VALUE, got {text!r}")
    return key, value


class Command(
    adaptation_cli.AdaptationCommands,
    folders_cli.FolderCommands,
    verify_cli.VerifyCommands,
    version_cli.VersionCommands,
    BaseCommand,
):
    help = "Create, run and inspect campaigns."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        create = sub.add_parser("create", help="create a campaign and import its units")
        create.add_argument("name")
        create.add_argument("--processor", required=True, choices=sorted(all_specs()))
        source = create.add_mutually_exclusive_group(required=True)
        source.add_argument("--input", type=Path, help="folder of inputs (read recursively)")
        source.add_argument("--manifest", type=Path, help="CSV or JSONL with id, path columns")
        source.add_argument(
            "--records",
            type=Path,
            help="a JSONL(.gz), CSV, Parquet or Arrow file, or a folder of them: a unit a row",
        )
        create.add_argument("--text-column", help="with --records: the text's column")
        create.add_argument("--id-column", help="with --records: the ids' (default: file:line)")
        create.add_argument("--category-column", help="with --records: the categories'")
        create.add_argument(
            "--param-column",
            action="append",
            default=[],
            metavar="NAME[=COLUMN]",
            help="with --records: a parameter each row sets for itself from a column (such "
            "as text-generation's system_prompt=system); repeatable",
        )
        create.add_argument(
            "--root", type=Path, help="folder manifest paths are relative to (default: its folder)"
        )
        create.add_argument("--project", default="default")
        create.add_argument(
            "--param",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="processor parameter, repeatable (e.g. batch_size=32)",
        )
        create.add_argument(
            "--checkpoint",
            type=int,
            default=None,
            metavar="N",
            help="stop for a spot check after N units (default max(1%%, 200); 0: never)",
        )
        create.add_argument(
            "--holdout", type=float, default=0.05, help="share of units held out (0.05)"
        )
        create.add_argument(
            "--no-folder-categories",
            dest="folder_categories",
            action="store_false",
            help="do not take a unit's top folder as its category (docs/importing.md)",
        )
        create.add_argument("--json", action="store_true", help="the import report as JSON")

        more = sub.add_parser(
            "import",
            help="import into an existing campaign: a manifest, or its folder again "
            "(ids it has are counted, not duplicated; docs/importing.md)",
        )
        more.add_argument("name")
        more.add_argument(
            "--manifest", type=Path, help="CSV or JSONL, paths relative to the campaign's root"
        )
        more.add_argument(
            "--no-folder-categories",
            dest="folder_categories",
            action="store_false",
            help="do not take a new unit's top folder as its category",
        )
        more.add_argument("--json", action="store_true", help="the import report as JSON")

        run = sub.add_parser("run", help="enqueue the units still to do")
        run.add_argument("name")
        run.add_argument("--wait", action="store_true", help="show progress until done")
        run.add_argument(
            "--timeout",
            type=float,
            default=None,
            help="with --wait: give up after this many seconds (exit 1)",
        )

        verify = sub.add_parser(
            "verify", help="check every unit against the disk and correct the states"
        )
        verify.add_argument("name")
        verify.add_argument("--json", action="store_true")
        verify.add_argument(
            "--deep",
            action="store_true",
            help="also checksum every input and output and load every output",
        )
        verify.add_argument(
            "--last",
            action="store_true",
            help="print the last verify's stored report; checks nothing and moves no state",
        )

        resume = sub.add_parser("resume", help="verify, then enqueue only the units that need it")
        resume.add_argument("name")
        resume.add_argument(
            "--retry-failed",
            action="store_true",
            help="also retry failed units (inputs still missing stay failed)",
        )
        resume.add_argument("--wait", action="store_true")
        resume.add_argument("--timeout", type=float, default=None)

        export = sub.add_parser(
            "export", help="write manifest, results, errors and parameter versions"
        )
        export.add_argument("name")
        export.add_argument("--to", type=Path, required=True, help="folder to write into")

        listing = sub.add_parser("list", help="all campaigns with their counts")
        listing.add_argument("--json", action="store_true")

        profile = sub.add_parser(
            "profile",
            help="measure the batch size on the heaviest inputs and estimate the corpus "
            "(runs here, on this machine's device)",
        )
        profile.add_argument("name")
        profile.add_argument("--margin", type=float, default=0.2, help="memory kept free (0.2)")
        profile.add_argument(
            "--budget-mb",
            type=int,
            default=None,
            help="memory budget in MiB (default: the CUDA device's memory; on CPU "
            "PROFILE_CPU_MEMORY_BUDGET_MB; either ÷ WORKERS_PER_DEVICE)",
        )
        profile.add_argument("--max-batch", type=int, default=1024)
        profile.add_argument("--sample", type=int, default=48, help="ordinary units at random")
        profile.add_argument("--heavy", type=int, default=12, help="heaviest units added")
        profile.add_argument(
            "--rerun",
            type=int,
            default=None,
            metavar="ID",
            help="run profile ID's saved sample again, with its parameters, margin and "
            "maximum batch (--budget-mb still applies), and compare the two",
        )
        profile.add_argument("--json", action="store_true")

        checkpoint = sub.add_parser(
            "checkpoint",
            help="pass or fail the checkpoint that waits for the current version's spot check",
        )
        checkpoint.add_argument("name")
        checkpoint.add_argument("verdict", choices=["pass", "fail"])
        checkpoint.add_argument("--note", default="", help="why (a failure needs one)")
        checkpoint.add_argument("--as", dest="user", default=None, help="the reviewer's username")

        version_cli.add_parsers(sub)
        folders_cli.add_parsers(sub)

        status = sub.add_parser("status", help="counts of one campaign")
        status.add_argument("name")
        status.add_argument("--json", action="store_true")

        adaptation_cli.add_parsers(sub)

    def handle(self, *args, action: str, **options):
        try:
            return getattr(self, f"_{action.replace('-', '_')}")(**options)
        except (ValidationError, ManifestError) as exc:
            messages = getattr(exc, "messages", [str(exc)])
            raise CommandError("; ".join(messages)) from exc

    def _create(
        self,
        *,
        name,
        processor,
        input,
        manifest,
        records,
        text_column,
        id_column,
        category_column,
        param_column,
        root,
        project,
        param,
        checkpoint,
        holdout,
        folder_categories: bool,
        json: bool,
        **_,
    ):
        params = dict(_param(p) for p in param)
        owner = setup.project_for_user(name=project)
        # The operator's command: a folder none of the project's covers becomes
        # one of them (docs/operations.md, "Giving a project its folders").
        top = setup.campaign_root(
            input_folder=input, manifest=manifest, input_root=root, records=records
        )
        columns = None
        if records is not None:
            if not text_column:
                raise CommandError("--records needs --text-column")
            try:
                row_params = param_columns(param_column)
            except ValueError as exc:
                raise CommandError(f"--param-column {exc}") from None
            columns = RecordColumns(
                text=text_column, id=id_column, category=category_column, params=row_params
            )
        elif param_column:
            raise CommandError("--param-column is for --records")
        granted = covering(project=owner, path=real_path(top)) is None
        with self._import_progress(quiet=json):
            campaign, report = setup.campaign_create(
                checkpoint_after=checkpoint,
                holdout_share=holdout,
                name=name,
                processor=processor,
                project=owner,
                input_folder=input,
                manifest=manifest,
                input_root=root,
                params=params,
                folder_categories=folder_categories,
                records=records,
                columns=columns,
            )
        if json:
            self.stdout.write(_dumps({"campaign": campaign.name, **report.as_dict()}))
            return
        self.stdout.write(
            f"created campaign {campaign.name} ({campaign.current_version.label}): "
            f"{report.created} units, {report.failed} failed at import"
        )
        if granted:
            self.stdout.write(f"project {owner.name} may now read {campaign.input_root}")
        self._print_problems(report)

    def _import(self, *, name, manifest, folder_categories: bool, json: bool, **_):
        campaign = campaign_named(name)
        with self._import_progress(quiet=json):
            report = setup.campaign_import(
                campaign=campaign, manifest=manifest, folder_categories=folder_categories
            )
        if json:
            self.stdout.write(_dumps({"campaign": campaign.name, **report.as_dict()}))
            return
        self.stdout.write(
            f"{campaign.name}: {report.created} new units ({report.failed} failed at import), "
            f"{report.existing} already there ({report.changed} changed), "
            f"{report.duplicates} duplicate ids skipped, {report.removed} "
            + ("rows no longer there" if campaign.records else "files gone")
        )
        self._print_problems(report)

    @contextmanager
    def _import_progress(self, *, quiet: bool):
        """A rows/s bar on stderr while an import runs; none for --json or a non-terminal."""
        bar = tqdm(
            desc="import",
            unit=" rows",
            unit_scale=True,
            file=self.stderr._out,
            disable=True if quiet else None,  # None: tqdm's own "is it a terminal?"
        )
        with bar, importing.reporting_progress(bar.update):
            yield

    def _print_problems(self, report, shown: int = 20) -> None:
        if identical := report.identical_summary():
            self.stdout.write(identical)
        for line in report.skipped_lines():
            self.stdout.write(line if line.endswith(":") else f"  {line}")
        for problem in report.problems[:shown]:
            self.stdout.write(f"  {problem}")
        if report.problem_count > shown:
            self.stdout.write(
                f"  … and {report.problem_count - shown} more (failed units are listed "
                "with their reasons on the campaign page)"
            )

    def _run(self, *, name, wait, timeout, **_):
        campaign = campaign_named(name)
        if adaptation.is_adaptation(campaign):
            return self._train(name=name, wait=wait, timeout=timeout)
        with start.broker_outage_noted() as outage:
            batches = start.campaign_run(campaign=campaign)
        status = verification_status(campaign=campaign)
        if status.status == "checkpoint pending":
            self.stdout.write("stopped at the checkpoint: review the spot-check sample (/review/)")
        self.stdout.write(f"enqueued {batches} batch{'es' if batches != 1 else ''}")
        if outage:
            raise CommandError(start.broker_outage_reason(outage))
        if wait:
            self._wait(campaign, timeout)

    def _wait(self, campaign: Campaign, timeout: float | None) -> None:
        started = time.monotonic()
        counts = selectors.campaign_counts(campaign=campaign)
        with tqdm(
            total=counts.total,
            initial=counts.done,
            unit="unit",
            desc=campaign.name,
            file=self.stderr._out,
        ) as bar:
            while counts.active:
                if timeout is not None and time.monotonic() - started > timeout:
                    busy = counts.queued + counts.running
                    raise CommandError(
                        (
                            f"still {busy} units queued or running"
                            if busy or not counts.planning
                            else "the rest of the run still being planned"
                        )
                        + f" after {timeout:g}s; is a worker running? (make run starts one)"
                    )
                time.sleep(0.5)
                counts = selectors.campaign_counts(campaign=campaign)
                bar.update(counts.done - bar.n)
        self.stdout.write(
            f"{campaign.name}: {counts.succeeded} succeeded, {counts.failed} failed, "
            f"{counts.needs_review} need review, {counts.pending} pending"
        )
        if not counts.pending:
            return
        # What holds the pending units, in the words of the page's header.
        state = selectors.campaign_run_state(campaign_id=campaign.pk, counts=counts)
        if state.key == "checkpoint" and (held := start.pending_held(campaign=campaign)):
            self.stdout.write(f"stopped: {held} (campaign checkpoint {campaign.name} pass|fail)")
        else:
            self.stdout.write(f"stopped: {state.label}: {state.detail}")

    def _resume(self, *, name, retry_failed: bool, wait: bool, timeout, **_):
        campaign = campaign_named(name)
        with start.broker_outage_noted() as outage:
            report, retried, batches = control.campaign_resume(
                campaign=campaign, retry_failed=retry_failed
            )
        self._print_report(report)
        if outage:
            raise CommandError(start.broker_outage_reason(outage))
        if adaptation.is_adaptation(campaign):
            return self._train(name=name, wait=wait, timeout=timeout)
        if retry_failed:
            self.stdout.write(f"retrying {retried} failed unit{'s' if retried != 1 else ''}")
        self.stdout.write(f"enqueued {batches} batch{'es' if batches != 1 else ''}")
        if wait:
            self._wait(campaign, timeout)

    def _export(self, *, name, to: Path, **_):
        try:
            written = export(campaign_named(name), to)
        except ExportError as exc:
            raise CommandError(str(exc)) from exc
        for path in written:
            self.stdout.write(f"wrote {path}")

    def _list(self, *, json: bool, **_):
        campaigns = list(Campaign.objects.select_related("project").order_by("name"))
        counts = selectors.counts_by_campaign(campaign_ids=[c.pk for c in campaigns])
        rows = [
            {**counts[c.pk].as_dict(c.name), "project": c.project.name, "processor": c.processor}
            for c in campaigns
        ]
        if json:
            self.stdout.write(_dumps(rows))
            return
        for row in rows:
            self.stdout.write(
                f"{row['campaign']:<30} {row['processor']:<16} "
                f"{row['succeeded']}/{row['total']} succeeded, {row['failed']} failed"
            )

    def _profile(
        self, *, name, margin, budget_mb, max_batch, sample, heavy, rerun, json: bool, **_
    ):
        from campaigns.models import Profile
        from campaigns.profiles.report import (
            comparison_text,
            profile_comparison,
            profile_report,
            profile_text,
        )
        from campaigns.profiles.services import profile_create, profile_rerun
        from gpuworker.profiler import profile_run  # this command runs the model

        campaign = campaign_named(name)
        budget = budget_mb * 1024 * 1024 if budget_mb else None
        original = None
        try:
            if rerun is not None:
                original = Profile.objects.filter(pk=rerun, campaign=campaign).first()
                if original is None:
                    raise CommandError(f"{campaign.name} has no profile {rerun}")
                profile = profile_rerun(profile=original, memory_budget=budget)
            else:
                profile = profile_create(
                    campaign=campaign,
                    margin=margin,
                    memory_budget=budget,
                    max_batch_size=max_batch,
                    sample_size=sample,
                    heavy=heavy,
                )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        profile_run(profile.pk)
        profile.refresh_from_db()
        report = profile_report(profile)
        if original is not None:
            report["compared_with"] = profile_comparison(profile=profile, other=original)
        if json:
            self.stdout.write(_json.dumps(report, indent=2, default=str))
        else:
            lines = profile_text(report)
            if original is not None:
                lines += comparison_text(report["compared_with"])
            for line in lines:
                self.stdout.write(line)
        if profile.state != profile.State.DONE:
            raise CommandError(f"profile failed: {profile.error}")

    def _checkpoint(self, *, name, verdict: str, note: str, user, **_):
        campaign = campaign_named(name)
        waiting = Checkpoint.objects.filter(
            campaign=campaign, version=campaign.current_version, state=Checkpoint.State.PENDING
        ).first()
        if waiting is None:
            raise CommandError(f"no checkpoint of {campaign.name}'s current version waits")
        reviewer = None
        if user is not None:
            reviewer = get_user_model().objects.filter(username=user).first()
            if reviewer is None:
                raise CommandError(f"no user named {user!r}")
        checkpoint_decide(checkpoint=waiting, passed=verdict == "pass", user=reviewer, reason=note)
        if verdict == "fail":
            self.stdout.write(
                "checkpoint failed: the campaign stays where it is until the method changes "
                "(save changed parameters: a new parameter version)"
            )
            return
        with start.broker_outage_noted() as outage:
            batches = start.campaign_run(campaign=campaign)
        self.stdout.write(
            f"checkpoint passed: enqueued {batches} batch{'es' if batches != 1 else ''}"
        )
        if outage:
            raise CommandError(start.broker_outage_reason(outage))

    def _status(self, *, name, json: bool, **_):
        campaign = campaign_named(name)
        counts = selectors.campaign_counts(campaign=campaign)
        state = selectors.campaign_run_state(campaign_id=campaign.pk, counts=counts)
        watch = watch_state.watch_json(
            campaign=campaign,
            counts=counts,
            broker_check=lambda: broker_queue_waiting(BATCH_QUEUE),
        )
        if json:
            self.stdout.write(
                _dumps(
                    {
                        **counts.as_dict(campaign.name),
                        "state": dataclasses.asdict(state),
                        "watch": watch,
                    }
                )
            )
            return
        self.stdout.write(
            f"{campaign.name}: {counts.total} units — {counts.succeeded} succeeded, "
            f"{counts.failed} failed, {counts.pending} pending, {counts.queued} queued, "
            f"{counts.running} running"
        )
        self.stdout.write(f"{state.label}: {state.detail}")
        for line in watch_summary.status_lines(watch):
            self.stdout.write(line)
        for error_class, n in sorted(counts.by_error.items()):
            self.stdout.write(f"  {error_class}: {n}")
        if open_items := selectors.open_review_items(campaign=campaign):
            self.stdout.write(f"{open_items} open review item{'s' if open_items != 1 else ''}")


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
