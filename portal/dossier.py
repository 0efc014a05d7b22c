"""The order dossier: one zip with everything a customer's order holds.

The customer downloads it from the tracking page at any time; a copy is kept
under DOSSIER_ROOT, named by the order's reference, and can be regenerated at
will: the same data always gives the same bytes (fixed entry order, dates,
permissions and compression), so a changed checksum means changed data.

A download sends the kept copy while the data it was built from is unchanged
(`dossier_open`): a linked campaign's manifest can hold a million rows, and
rebuilding it on every click would make the download a way to load the server.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Count, Max, Sum

from campaigns.exports.csv_stream import safe_row
from campaigns.models import (
    Batch,
    Campaign,
    Profile,
    Reconciliation,
    ReviewDecision,
    ReviewItem,
    Unit,
    UnitCount,
    UnitState,
)
from campaigns.profiles.report import profile_report
from campaigns.storage.outputs import write_atomic
from portal.models import Order, format_amount
from portal.ssh_keys import KeyRefused, parse_key

# Fixed so the same data compresses to the same bytes, on every run.
_COMPRESSION = zipfile.ZIP_DEFLATED
_COMPRESSLEVEL = 6
# A regular file, rw-r--r--: what the customer's unzip gives them.
_FILE_MODE = 0o100644 << 16
# Unix, whatever machine builds it: create_system is part of the bytes.
_CREATE_SYSTEM = 3
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_ZIP_LAST = (2107, 12, 31, 23, 59, 58)
_CHUNK = 2000

_NO_ESTIMATE = {"estimate": None, "note": "no profile has been run for this campaign"}
# Part of the fingerprint: a change of the layout below must not serve zips
# kept from the old one. Bump it with any change to what a dossier holds.
DOSSIER_FORMAT = 3
_HASH_CHUNK = 1024 * 1024


def dossier_bytes(*, order: Order) -> bytes:
    """The dossier zip of an order; identical bytes for identical data."""
    date_time = _zip_date_time(order.created_at)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=_COMPRESSION, compresslevel=_COMPRESSLEVEL) as zf:
        _write(zf, "README.txt", date_time, _readme(order).encode("utf-8"))
        _write(zf, "order.json", date_time, _json(order_summary(order=order)))
        campaign = order.campaign
        if campaign is not None:
            _write_csv(
                zf,
                "campaign/manifest.csv",
                date_time,
                ["id", "path", "size", "sha256"],
                _manifest_rows(campaign),
            )
            _write(
                zf,
                "campaign/parameter_versions.json",
                date_time,
                _json(_parameter_versions(campaign)),
            )
            _write_csv(zf, "campaign/batches.csv", date_time, _BATCH_HEADER, _batch_rows(campaign))
            _write_csv(
                zf,
                "campaign/errors.csv",
                date_time,
                ["id", "path", "state", "error_class", "error_message"],
                _error_rows(campaign),
            )
            _write(zf, "campaign/estimate.json", date_time, _json(order_estimate(order=order)))
    return buf.getvalue()


def dossier_path(*, order: Order) -> Path:
    return Path(settings.DOSSIER_ROOT) / f"{order.reference}.zip"


def dossier_store(*, order: Order) -> Path:
    """Write the dossier next to the others, atomically: kept with the order,
    regenerable, and a reader never sees half a zip."""
    path = dossier_path(order=order)
    _store(path, dossier_bytes(order=order), dossier_fingerprint(order=order))
    return path


def dossier_open(*, order: Order) -> tuple[BinaryIO, bool]:
    """The dossier to send, and whether it had to be built.

    The kept zip when its fingerprint is the data's fingerprint now and its
    bytes are the ones that fingerprint was recorded with; else a new build,
    kept for the next download.
    """
    fingerprint = dossier_fingerprint(order=order)
    path = dossier_path(order=order)
    recorded = _recorded(path)
    if recorded is not None and recorded.get("fingerprint") == fingerprint:
        kept = _open_if_sha256(path, recorded.get("sha256"))
        if kept is not None:
            return kept, False
    data = dossier_bytes(order=order)
    _store(path, data, fingerprint)
    return io.BytesIO(data), True


def dossier_fingerprint(*, order: Order) -> str:
    """A hash of what the dossier is built from.

    The order's part exactly (order.json and the README are cheap to make);
    a linked campaign's versions and estimate exactly too, and its units and
    batches by counters that move with every write the campaign code makes:
    the highest unit id (imports), the units per state and error class (kept
    by triggers), batches per state with their deliveries and times, review
    items and decisions, verify runs. A row edited by hand in the database
    moves none of them: delete the kept zip (or run dossier_store) then.
    """
    digest = hashlib.sha256()
    digest.update(f"format {DOSSIER_FORMAT}\n".encode())
    digest.update(_readme(order).encode("utf-8"))
    digest.update(_json(order_summary(order=order)))
    campaign = order.campaign
    if campaign is not None:
        digest.update(_json(_parameter_versions(campaign)))
        digest.update(_json(order_estimate(order=order)))
        digest.update(_json(_campaign_counters(campaign), default=str))
    return digest.hexdigest()


def _campaign_counters(campaign: Campaign) -> dict[str, Any]:
    # Aggregates over indexed columns: a few queries whatever the corpus size.
    units = Unit.objects.filter(campaign=campaign).aggregate(last=Max("pk"))
    states = (
        UnitCount.objects.filter(campaign=campaign)
        .values("state", "error_class")
        .annotate(n=Sum("n"))
        .order_by("state", "error_class")
    )
    batches = Batch.objects.filter(campaign=campaign)
    return {
        "last_unit": units["last"],
        "unit_states": [[row["state"], row["error_class"], row["n"]] for row in states if row["n"]],
        "batches": batches.aggregate(
            n=Count("pk"),
            last=Max("pk"),
            deliveries=Sum("deliveries"),
            started=Max("started_at"),
            finished=Max("finished_at"),
        ),
        "batch_states": sorted(
            batches.values("state").annotate(n=Count("pk")).values_list("state", "n")
        ),
        "review_items": ReviewItem.objects.filter(campaign=campaign).aggregate(last=Max("pk")),
        "review_decisions": ReviewDecision.objects.filter(item__campaign=campaign).aggregate(
            last=Max("pk")
        ),
        "reconciliations": Reconciliation.objects.filter(campaign=campaign).aggregate(
            last=Max("pk")
        ),
    }


def _fingerprint_path(path: Path) -> Path:
    return path.with_name(path.name + ".fingerprint")


def _store(path: Path, data: bytes, fingerprint: str) -> None:
    written = write_atomic(path, data)
    # The zip's own sha256 beside the fingerprint: of two builds racing, the
    # zip of one and the record of the other never pass for a match.
    record = {"fingerprint": fingerprint, "sha256": written.sha256}
    write_atomic(_fingerprint_path(path), _json(record))


def _recorded(path: Path) -> dict | None:
    try:
        record = json.loads(_fingerprint_path(path).read_bytes())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _open_if_sha256(path: Path, expected: object) -> BinaryIO | None:
    """The kept zip, open, if its bytes hash to `expected`. The same open file
    is sent: a build replacing the path meanwhile does not change what it reads."""
    try:
        handle = path.open("rb")
    except OSError:
        return None
    digest = hashlib.sha256()
    while chunk := handle.read(_HASH_CHUNK):
        digest.update(chunk)
    if digest.hexdigest() != expected:
        handle.close()
        return None
    handle.seek(0)
    return handle


# --- order.json -----------------------------------------------------------------


def order_summary(*, order: Order) -> dict[str, Any]:
    """The order as the customer sees it: choices, prices, quote, payment,
    history. Never the tracking token: the file may be forwarded."""
    try:
        address = order.payment_address
    except ObjectDoesNotExist:
        address = None
    currency = order.currency
    return {
        "reference": order.reference,
        "status": order.status,
        "status_label": order.get_status_display(),
        "exception": order.exception,
        "exception_label": order.get_exception_display() if order.exception else "",
        # Beside the exception: a late payment can also be over or short.
        "paid_late": order.paid_late,
        "created_at": _time(order.created_at),
        "starts_at": _time(order.starts_at),
        "ends_at": _time(order.ends_at),
        "contact": {
            "first_name": order.first_name,
            "last_name": order.last_name,
            "email": order.email,
        },
        "plan": {
            "gpu": {
                "name": order.gpu.name,
                "architecture": order.gpu.architecture,
                "memory_gb": order.gpu.memory_gb,
            },
            "quantity": order.quantity,
            "duration_days": order.duration_days,
            "environment": {
                "name": order.environment.name,
                "framework": order.environment.framework,
                "framework_version": order.environment.framework_version,
                "cuda_version": order.environment.cuda_version,
                "image": order.environment.image,
            },
        },
        "price": {
            "price_per_day": str(order.price_per_day),
            "total": str(order.fiat_total),
            "currency": order.fiat_currency,
        },
        "quote": {
            "currency": currency.code,
            # The same digits as in the payment URI: what the customer sends.
            "amount": format_amount(order.crypto_amount, currency.decimals),
            "rate": _decimal(order.rate),
            "rate_unit": f"{order.fiat_currency} per {currency.code}",
            "rate_recorded_at": _time(order.rate_recorded_at),
            "expires_at": _time(order.quote_expires_at),
        },
        "payment": {
            "address": address.address if address else None,
            "uri": order.payment_uri() if address else None,
            "btcpay_invoice": order.btcpay_invoice_id or None,
        },
        "campaign": order.campaign.name if order.campaign_id else None,
        # What the machines are set up with; never how to reach them (host,
        # user, notebook token): the file may be forwarded.
        "access": {
            "ssh_keys": _ssh_keys(order),
            "export_folders": list(order.export_folders or []),
            "batch_list": order.batch_list(),
        },
        "notices": [
            {
                "time": _time(notice.created_at),
                "transaction_id": notice.transaction_id,
                "claimed_amount": _decimal(notice.claimed_amount),
                "after_expiry": notice.after_expiry,
            }
            for notice in order.notices.order_by("created_at", "pk")
        ],
        "events": [
            {
                "time": _time(event.created_at),
                "from": event.from_status,
                "to": event.to_status,
                "actor": event.actor,
                "note": event.note,
            }
            for event in order.events.order_by("created_at", "pk")
        ],
    }


def _ssh_keys(order: Order) -> list[dict[str, str]]:
    keys = []
    for line in order.ssh_public_keys or []:
        try:
            key = parse_key(line)
        except KeyRefused:
            continue  # the tracking page says which; the dossier lists the good ones
        keys.append({"type": key.key_type, "fingerprint": key.fingerprint, "comment": key.comment})
    return keys


# --- campaign files --------------------------------------------------------------


def _manifest_rows(campaign: Campaign) -> Iterable[tuple]:
    # values_list + iterator: a million units stream as tuples, never as models.
    return (
        Unit.objects.filter(campaign=campaign)
        .order_by("uid")
        .values_list("uid", "source_path", "size", "sha256")
        .iterator(chunk_size=_CHUNK)
    )


def _error_rows(campaign: Campaign) -> Iterable[tuple]:
    return (
        Unit.objects.filter(campaign=campaign, state__in=[UnitState.FAILED, UnitState.NEEDS_REVIEW])
        .order_by("uid")
        .values_list("uid", "source_path", "state", "error_class", "error_message")
        .iterator(chunk_size=_CHUNK)
    )


_BATCH_FIELDS = (
    "pk",
    "version_id",
    "state",
    "size",
    "policy",
    "real_tokens",
    "padded_tokens",
    "compute_seconds",
    "mem_allocated",
    "mem_reserved",
    "mem_peak_allocated",
    "mem_peak_reserved",
    "rss",
    "deliveries",
    "started_at",
    "finished_at",
)
_BATCH_HEADER = ["id", "version", *_BATCH_FIELDS[2:]]


def _batch_rows(campaign: Campaign) -> Iterable[list]:
    # A campaign has a handful of versions: one query for their labels, not one per batch.
    labels = {version.pk: version.label for version in campaign.versions.all()}
    rows = (
        Batch.objects.filter(campaign=campaign)
        .order_by("pk")
        .values_list(*_BATCH_FIELDS)
        .iterator(chunk_size=_CHUNK)
    )
    for pk, version_id, *measured, started_at, finished_at in rows:
        yield [pk, labels.get(version_id, ""), *measured, _time(started_at), _time(finished_at)]


def _parameter_versions(campaign: Campaign) -> dict[str, Any]:
    return {
        "campaign": campaign.name,
        "processor": campaign.processor,
        "current": campaign.current_version.label if campaign.current_version_id else None,
        "versions": [
            {
                "number": version.number,
                "label": version.label,
                "fingerprint": version.fingerprint,
                "params": version.params,
                "software": version.software,
                "created_at": _time(version.created_at),
            }
            for version in campaign.versions.order_by("number")
        ],
    }


def order_estimate(*, order: Order, campaign: Campaign | None = None) -> dict[str, Any]:
    """The profile and estimate the rental was sized on, for the order's
    campaign or another campaign of its batch list (the dossier's
    estimate.json, the staff's order page).

    The one the customer ordered from ("Order this plan"), else the latest
    finished before the order was made: a profile run afterwards never
    rewrites what this order was based on.
    """
    campaign = campaign or order.campaign
    if campaign is None:
        return dict(_NO_ESTIMATE)
    profile, sized_on = None, "the profile the order was made from"
    if order.profile is not None and order.profile.campaign_id == campaign.pk:
        profile = order.profile
    if profile is None:
        profile = (
            Profile.objects.filter(
                campaign=campaign,
                state=Profile.State.DONE,
                created_at__lte=order.created_at,
            )
            .order_by("-created_at", "-pk")
            .first()
        )
        sized_on = "the latest profile finished before the order"
    if profile is None:
        return dict(_NO_ESTIMATE)
    return {"sized_on": sized_on, **profile_report(profile)}


# --- README.txt -------------------------------------------------------------------


def _readme(order: Order) -> str:
    lines = [
        f"Dossier of order {order.reference}.",
        "order.json: your choices, prices, locked quote, payment address and URI, "
        "contact, the SSH keys (fingerprints), export folders and batch list the machines "
        "are set up with, payment notices and the order's history (times in UTC, ISO 8601).",
    ]
    if order.campaign_id:
        lines.append(
            "campaign/: manifest.csv (every input with its size and sha256), "
            "parameter_versions.json, batches.csv (one row per batch with its measurements), "
            "errors.csv (inputs that failed or need review, with the reason) and estimate.json."
        )
    return "\n".join(lines) + "\n"


# --- zip writing --------------------------------------------------------------------


def _zip_date_time(moment: datetime | None) -> tuple[int, int, int, int, int, int]:
    # The order's own creation time, not "now": regenerating must not change the bytes.
    # A zip stores 1980..2107 only.
    if moment is None:
        return _ZIP_EPOCH
    stamp = moment.astimezone(UTC).timetuple()[:6] if moment.tzinfo else moment.timetuple()[:6]
    return max(_ZIP_EPOCH, min(_ZIP_LAST, tuple(stamp)))


def _info(name: str, date_time: tuple[int, ...]) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=date_time)
    info.compress_type = _COMPRESSION
    # Python 3.11 has no public setter for an entry's level; ZipFile.open(info, "w")
    # reads this attribute (3.13 keeps it as an alias of compress_level).
    info._compresslevel = _COMPRESSLEVEL
    info.create_system = _CREATE_SYSTEM
    info.external_attr = _FILE_MODE
    return info


def _write(zf: zipfile.ZipFile, name: str, date_time: tuple[int, ...], data: bytes) -> None:
    zf.writestr(_info(name, date_time), data)


def _write_csv(
    zf: zipfile.ZipFile,
    name: str,
    date_time: tuple[int, ...],
    header: list[str],
    rows: Iterable[Sequence[Any]],
) -> None:
    # Straight into the compressed entry: the CSV text is never whole in memory.
    with zf.open(_info(name, date_time), mode="w") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        writer = csv.writer(text)
        writer.writerow(header)
        writer.writerows(safe_row(row) for row in rows)  # no cell runs as a formula
        text.flush()
        text.detach()


def _json(value: Any, default=None) -> bytes:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=default)
    return (text + "\n").encode("utf-8")


def _time(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return (moment.astimezone(UTC) if moment.tzinfo else moment).isoformat()


def _decimal(value: Decimal | None) -> str | None:
    # Fixed-point, no exponent, no padding zeros from the column's scale.
    return None if value is None else f"{value.normalize():f}"
