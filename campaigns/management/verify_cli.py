"""`campaign verify NAME [--deep] [--json] [--last]`: every unit checked against
the disk and its state corrected, or the last stored report printed as it was."""

from __future__ import annotations

import json
from typing import Any

from campaigns.management.lookup import campaign_named
from campaigns.verify.reconcile import Verdict, campaign_verify, last_report


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


class VerifyCommands:
    """The verify subcommand's handlers, mixed into the `campaign` command."""

    stdout: Any

    def _verify(self, *, name, json: bool, deep: bool, last: bool = False, **_):
        if last:
            return self._last_verify(name=name, json=json)
        report = campaign_verify(campaign=campaign_named(name), deep=deep)
        if json:
            self.stdout.write(_dumps(report.as_dict()))
            return
        self._print_report(report)

    def _last_verify(self, *, name, json: bool) -> None:
        campaign = campaign_named(name)
        found = last_report(campaign=campaign)
        if found is None:
            message = f"never verified (campaign verify {name} checks it now)"
            self.stdout.write(
                _dumps({"campaign": name, "verified_at": None}) if json else f"{name}: {message}"
            )
            return
        report, at = found
        if json:
            self.stdout.write(_dumps({**report.as_dict(), "verified_at": at.isoformat()}))
            return
        self.stdout.write(f"last verify at {at:%Y-%m-%d %H:%M:%S %Z}; nothing was checked now")
        self._print_report(report)

    def _print_report(self, report) -> None:
        data = report.as_dict()
        self.stdout.write(
            f"{report.campaign}: {data['total']} units "
            f"({'deep' if report.deep else 'stat and header'} check, "
            f"{data['seconds']:.2f}s)"
        )
        for verdict in Verdict.ALL:
            if data[verdict]:
                self.stdout.write(f"  {verdict:<18} {data[verdict]:>9}")
                for sample in data["samples"].get(verdict, [])[:5]:
                    if sample["reason"]:
                        self.stdout.write(f"      {sample['id']}: {sample['reason']}")
        self.stdout.write(f"  {'orphan outputs':<18} {data['orphan_outputs']:>9}")
        for rel in data["orphan_samples"][:5]:
            self.stdout.write(f"      {rel}")
        self.stdout.write(f"  {'stale temp removed':<18} {data['stale_temp_files_removed']:>9}")
        if data["damaged_set_aside"]:
            self.stdout.write(f"  {'damaged set aside':<18} {data['damaged_set_aside']:>9}")
        self.stdout.write(f"  {'states corrected':<18} {data['corrected']:>9}")
