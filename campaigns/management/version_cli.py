"""`campaign versions NAME` and `campaign compare NAME [A B]`: a campaign's
parameter versions over its corpus, and two of them compared (the same as
the campaign page's versions section)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from campaigns.management.lookup import campaign_named
from campaigns.review.compare import compare_versions
from campaigns.runs import versions


def add_parsers(sub: Any) -> None:
    listing = sub.add_parser(
        "versions", help="a campaign's parameter versions and how much of the corpus each made"
    )
    listing.add_argument("name")
    listing.add_argument("--json", action="store_true")
    compare = sub.add_parser(
        "compare",
        help="two versions over every unit both made (default: the current one and the one before)",
    )
    compare.add_argument("name")
    compare.add_argument("a", nargs="?", help="a version: 1, v1 or its full label")
    compare.add_argument("b", nargs="?")
    compare.add_argument("--json", action="store_true")


class VersionCommands:
    """The subcommands' handlers, mixed into the `campaign` command."""

    stdout: Any

    def _versions(self, *, name: str, json: bool, **_: Any) -> None:
        campaign = campaign_named(name)
        rows = versions.version_progress(campaign=campaign)
        if json:
            self.stdout.write(_dumps([_progress_dict(p) for p in rows]))
            return
        for p in rows:
            self.stdout.write(
                f"{p.version.label}{' (current)' if p.current else ''}: "
                f"{p.valid} of {p.total} units ({p.percent}%)"
                f"{' · whole corpus' if p.complete else ''} · checkpoint {p.checkpoint}"
            )

    def _compare(self, *, name: str, a: str | None, b: str | None, json: bool, **_: Any) -> None:
        campaign = campaign_named(name)
        numbers = list(campaign.versions.order_by("-number").values_list("number", flat=True))
        if a is None and b is None:
            if len(numbers) < 2:
                raise CommandError(f"{campaign.name} has one parameter version: nothing to compare")
            a, b = str(numbers[1]), str(numbers[0])
        elif a is None or b is None:
            raise CommandError("name both versions, or neither")
        first = versions.version_by_label(campaign=campaign, label=a)
        second = versions.version_by_label(campaign=campaign, label=b)
        if first is None or second is None:
            raise CommandError(f"no such version of {campaign.name}: {a if first is None else b}")
        report = compare_versions(campaign=campaign, a=first, b=second)
        if json:
            self.stdout.write(_dumps(report))
            return
        out = self.stdout
        out.write(
            f"{report['a']} against {report['b']}: {report['both']} units with a valid output "
            f"under both, {report['compared']} compared"
        )
        if report["mean_cosine"] is not None:
            pct = report["percentiles"]
            out.write(
                f"cosine: mean {report['mean_cosine']:.4f}, p1 {pct['p1']}, p5 {pct['p5']}, "
                f"median {pct['p50']}"
            )
        if report.get("label_agreement") is not None:
            out.write(
                f"top labels agree on {report['label_agreement']:.1%} of {report['labelled']} units"
            )
        for row in report["lowest"]:
            out.write(f"  moved most: {row['unit']} (cosine {row['cosine']:.4f})")
        for note in report["notes"]:
            out.write(f"note: {note}")


def _progress_dict(p: versions.VersionProgress) -> dict[str, Any]:
    return {
        "version": p.version.label,
        "number": p.version.number,
        "current": p.current,
        "valid": p.valid,
        "total": p.total,
        "complete": p.complete,
        "checkpoint": p.checkpoint,
        "params": p.version.params,
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
