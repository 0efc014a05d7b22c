"""What a profile measured and concluded, as plain data for the `campaign profile`
command, the campaign's profile page and the order dossier; and two profiles
of the same sample side by side.
"""

from __future__ import annotations

from campaigns.models import Estimate, Profile
from campaigns.profiles.tiers import TIERS_GB, memory_tier, tier_batches


def chosen_rate(profile: Profile) -> float | None:
    """Items per second at the chosen size on the hard inputs (the median of its runs)."""
    rates = sorted(
        step["items_per_s"]
        for step in profile.steps
        if step.get("batch_size") == profile.chosen_batch_size
        and step.get("phase") in ("heaviest", "leak check", "train")
        and step.get("items_per_s")
    )
    return rates[len(rates) // 2] if rates else None


#: Said wherever a chosen batch that is the cap is shown: the sweep stopped
#: there, not at the memory limit.
CAP_REACHED = "the cap was reached — larger batches may fit; raise the cap to look further"


def cap_reached(profile: Profile) -> bool:
    """Whether the chosen batch is where the sweep stopped for its cap (the
    largest batch to try) rather than for memory: no larger size was tried
    and failed. (A training sweep doubles up to the cap without trying it.)"""
    chosen = profile.chosen_batch_size
    return bool(chosen) and not any(
        step.get("batch_size", 0) > chosen and not step.get("fits") for step in profile.steps
    )


def report_steps(steps: list[dict]) -> list[dict]:
    """The steps with their write time per batch (measured per output, on a few)."""
    rows = []
    for step in steps:
        row = dict(step)
        if "write_s" not in row and row.get("write_s_per_item") is not None:
            row["write_s"] = round(row["write_s_per_item"] * row.get("batch_size", 0), 5)
        rows.append(row)
    return rows


def profile_report(profile: Profile) -> dict:
    """Everything a profile measured and concluded, as plain data (CLI, page, dossier)."""
    runtime = {k: v for k, v in profile.runtime.items() if k != "budget_source"}
    chosen_peak = profile.chosen_peak_reserved
    report = {
        "profile": profile.pk,
        "campaign": profile.campaign.name,
        "version": profile.version.label,
        "state": profile.state,
        "device": profile.device,
        "runtime": runtime,
        "memory_budget": profile.memory_budget,
        "budget_source": profile.runtime.get("budget_source"),
        "margin": profile.margin,
        "chosen_batch_size": profile.chosen_batch_size,
        "max_batch_size": profile.max_batch_size,
        "cap_reached": cap_reached(profile),
        "chosen_peak_reserved": chosen_peak,
        "chosen_tier_gb": memory_tier(chosen_peak, profile.margin) if chosen_peak else None,
        "memory_tiers": tier_batches(profile) if profile.chosen_batch_size else [],
        "largest_tier_gb": TIERS_GB[-1],
        "sample": {"units": len(profile.sample), "heaviest": len(profile.heavy)},
        "heaviest_tried": profile.heaviest_tried,
        "sample_failures": profile.sample_failures,
        "steps": report_steps(profile.steps),
        "leak": profile.leak,
        "policies": profile.policies,
        "error": profile.error,
        "created_at": profile.created_at.isoformat() if profile.created_at else None,
        "finished_at": profile.finished_at.isoformat() if profile.finished_at else None,
        "estimate": None,
    }
    estimate = Estimate.objects.filter(profile=profile).first()
    if estimate is not None:
        report["estimate"] = {
            "units": estimate.units,
            "batch_size": estimate.batch_size,
            "device": estimate.device,
            "hours_measured_device": round(estimate.hours_measured_device, 4),
            "hours_naive_sample_mean": round(estimate.hours_naive, 4),
            "peak_memory": estimate.peak_memory,
            "memory_tier_gb": estimate.memory_tier_gb,
            "output_bytes": estimate.output_bytes,
            "projections": estimate.projections,
            "plan": {
                "gpu": estimate.gpu_name,
                "quantity": estimate.quantity,
                "duration_days": estimate.duration_days,
            }
            if estimate.gpu_name
            else None,
            "reasoning": estimate.reasoning,
        }
    return report


#: What a profile ran on, compared row by row: a change of figures between two
#: devices means little when the software under them changed too.
SOFTWARE = (("device", "Device"), ("torch", "torch"), ("cuda", "CUDA"), ("driver", "Driver"))


def profile_software(profile: Profile) -> dict[str, str | None]:
    """The device and the torch, CUDA and driver versions the profile recorded
    (the worker's runtime facts; torch from its parameter version's software
    when the runtime lacks it); None where none was recorded (no CUDA on a CPU)."""
    runtime = profile.runtime or {}
    software = profile.version.software or {}
    return {
        "device": profile.device or None,
        "torch": runtime.get("torch") or software.get("torch") or None,
        "cuda": runtime.get("cuda") or None,
        "driver": runtime.get("driver") or None,
    }


def profile_summary(profile: Profile) -> dict:
    """The figures two profiles are compared on."""
    estimate = Estimate.objects.filter(profile=profile).first()
    return {
        "profile": profile.pk,
        "state": profile.state,
        "device": profile.device,
        "software": profile_software(profile),
        "version": profile.version.label,
        "created_at": profile.created_at.isoformat() if profile.created_at else None,
        "sample_units": len(profile.sample),
        "chosen_batch_size": profile.chosen_batch_size,
        "chosen_peak_reserved": profile.chosen_peak_reserved,
        "items_per_s": chosen_rate(profile),
        "hours": round(estimate.hours_measured_device, 4) if estimate else None,
        "estimate_batch_size": estimate.batch_size if estimate else None,
        "memory_tier_gb": estimate.memory_tier_gb if estimate else None,
    }


COMPARED = (
    ("chosen_batch_size", "Chosen batch size"),
    ("chosen_peak_reserved", "Peak reserved at the chosen size"),
    ("items_per_s", "Items/s at the chosen size"),
    ("hours", "Estimate, hours on the measured device"),
)


def profile_comparison(*, profile: Profile, other: Profile) -> dict:
    """Two profiles side by side: the same sample on another device, another day."""
    this, that = profile_summary(profile), profile_summary(other)
    rows = []
    for field, label in COMPARED:
        a, b = this[field], that[field]
        change = round((a - b) / b * 100, 1) if a is not None and b else None
        rows.append(
            {
                "field": field,
                "label": label,
                "this": a,
                "other": b,
                "pair": [a, b],
                "change": change,
            }
        )
    software_rows = [
        {
            "field": field,
            "label": label,
            "this": this["software"][field],
            "other": that["software"][field],
            "pair": [this["software"][field], that["software"][field]],
            "differs": this["software"][field] != that["software"][field],
        }
        for field, label in SOFTWARE
    ]
    return {
        "profile": this,
        "other": that,
        "same_sample": profile.sample == other.sample,
        "same_version": profile.version_id == other.version_id,
        "software_rows": software_rows,
        "software_warning": _software_warning(software_rows),
        "rows": rows,
    }


def _software_warning(rows: list[dict]) -> str:
    """Why the figures of two profiles may not compare as devices do: torch,
    CUDA or the driver changed between them, or one did not record torch."""
    if any(row["field"] == "torch" and None in row["pair"] for row in rows):
        return (
            "one of these profiles recorded no torch version: the software under the "
            "figures is unknown, so a difference may come from it as much as from the device"
        )
    changed = [
        f"{row['label']} {row['other'] or '—'} → {row['this'] or '—'}"
        for row in rows
        if row["field"] != "device" and row["differs"]
    ]
    if not changed:
        return ""
    return (
        f"the software differs ({'; '.join(changed)}): a difference in the figures may "
        "come from it as much as from the device"
    )


# --- as text, for the command line -------------------------------------------------


def profile_text(report: dict) -> list[str]:
    """The report as the `campaign profile` command prints it, a line a string."""
    lines: list[str] = []
    out = lines.append
    mib = 1024 * 1024
    out(f"profile {report['profile']} of {report['campaign']} on {report['device']}")
    source = f" ({report['budget_source']})" if report.get("budget_source") else ""
    out(f"  budget {report['memory_budget'] / mib:.0f} MiB{source}, margin {report['margin']:.0%}")
    out(
        f"  {'phase':<20} {'batch':>6}  prepare s  compute s    write s  items/s  "
        "peak alloc MiB  peak reserved MiB  fits"
    )
    for s in report["steps"]:
        rate = f"{s['items_per_s']:.1f}" if s.get("items_per_s") else "OOM"
        if s.get("error"):
            rate = "error"
        seconds = "".join(
            f"{s[key]:>11.3f}" if s.get(key) is not None else f"{'—':>11}"
            for key in ("prepare_s", "compute_s", "write_s")
        )
        phase = f"{s['phase']} ({s['kind']})" if s.get("kind") else s["phase"]
        out(
            f"  {phase:<20} {s['batch_size']:>6}{seconds} {rate:>8} "
            f"{s['peak_allocated'] / mib:>15.0f} {s['peak_reserved'] / mib:>18.0f}  "
            f"{'yes' if s['fits'] else 'no'}"
        )
    if report["chosen_batch_size"]:
        out(
            f"chosen batch size: {report['chosen_batch_size']} (peak reserved "
            f"{report['chosen_peak_reserved'] / mib:.0f} MiB on the heaviest inputs)"
        )
        if report["cap_reached"]:
            out(f"  {CAP_REACHED} (largest batch to try: {report['max_batch_size']}, --max-batch)")
    out(f"leak check: {report['leak'].get('message', 'not run')}")
    estimate = report["estimate"]
    if estimate:
        out(
            f"estimate: {estimate['hours_measured_device']:.3f} h on {estimate['device']} "
            f"(sample mean would say {estimate['hours_naive_sample_mean']:.3f} h), "
            f"memory tier {estimate['memory_tier_gb']} GB"
        )
        for line in estimate["reasoning"]:
            out(f"  - {line}")
    if report["error"]:
        out(f"error: {report['error']}")
    return lines


def comparison_text(comparison: dict) -> list[str]:
    """A re-run against the profile it repeats, as `campaign profile --rerun` prints it."""
    lines: list[str] = []
    out = lines.append
    this, other = comparison["profile"], comparison["other"]
    same = "the same sample" if comparison["same_sample"] else "a different sample"
    out(
        f"re-run of profile {other['profile']} ({same}): profile {other['profile']} on "
        f"{other['device'] or '?'} → profile {this['profile']} on {this['device'] or '?'}"
    )
    for row in comparison["software_rows"]:
        mark = "  (differs)" if row["differs"] else ""
        out(f"  {row['label']}: {row['other'] or '—'} → {row['this'] or '—'}{mark}")
    if comparison["software_warning"]:
        out(f"  warning: {comparison['software_warning']}")
    mib = 1024 * 1024
    for row in comparison["rows"]:
        a, b = row["this"], row["other"]
        if row["field"] == "chosen_peak_reserved":
            a, b = (f"{v / mib:.0f} MiB" if v is not None else "—" for v in (a, b))
        change = f" ({row['change']:+.1f}%)" if row["change"] is not None else ""
        out(f"  {row['label'].lower()}: {b} → {a}{change}")
    return lines
