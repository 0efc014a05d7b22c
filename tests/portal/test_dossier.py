from __future__ import annotations

import csv
import hashlib
import io
import json
import time
import zipfile
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from unittest import mock

import pytest

from campaigns.models import Batch, Unit
from portal import dossier, order_services
from portal.dossier import dossier_bytes, dossier_store
from portal.models import Order
from tests.conftest import DEMO_BAD, DEMO_GOOD


@pytest.fixture
def dossier_root(tmp_path, settings):
    root = tmp_path / "dossiers"
    settings.DOSSIER_ROOT = root
    return root


def _open(data: bytes) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(data))


def _order_json(data: bytes) -> dict:
    return json.loads(_open(data).read("order.json"))


def _csv_rows(zf: zipfile.ZipFile, name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(zf.read(name).decode("utf-8"))))


def _paid_and_seen(order: Order) -> Order:
    order_services.order_record_notice(
        order=order, transaction_id="tx-abc", claimed_amount=Decimal("0.00163334")
    )
    return order_services.order_mark_payment_seen(
        order=order, actor="btcpay", note="seen in the mempool"
    )


def test_the_dossier_holds_the_quote_address_notices_and_history_but_not_the_tracking_token(
    make_order,
):
    order = _paid_and_seen(make_order())

    data = dossier_bytes(order=order)

    zf = _open(data)
    assert zf.namelist() == ["README.txt", "order.json"]  # no campaign linked, no campaign files
    assert "order.json" in zf.read("README.txt").decode()
    doc = json.loads(zf.read("order.json"))
    assert doc["reference"] == order.reference
    assert doc["quote"]["amount"] == "0.00163334"
    assert doc["quote"]["currency"] == "BTC"
    assert doc["price"] == {"price_per_day": "14.00", "total": "98.00", "currency": "EUR"}
    assert doc["plan"]["gpu"]["name"] == "A40"
    assert doc["plan"]["quantity"] == 1 and doc["plan"]["duration_days"] == 7
    assert doc["payment"]["address"] == order.payment_address.address
    assert doc["payment"]["uri"] == order.payment_uri()
    assert doc["contact"] == {
        "first_name": "Ada",
        "last_name": "Lovelace",
        "email": "ada@example.org",
    }
    assert doc["status"] == "payment_seen"
    assert datetime.fromisoformat(doc["created_at"]) == order.created_at
    assert [
        (n["transaction_id"], n["claimed_amount"], n["after_expiry"]) for n in doc["notices"]
    ] == [("tx-abc", "0.00163334", False)]
    assert [(e["from"], e["to"], e["actor"]) for e in doc["events"]] == [
        ("", "awaiting_payment", "customer"),
        ("awaiting_payment", "payment_notified", "customer"),
        ("payment_notified", "payment_seen", "btcpay"),
    ]
    assert doc["events"][-1]["note"] == "seen in the mempool"
    # The token is the key to the tracking page: a forwarded dossier must not carry it.
    assert order.tracking_token.encode() not in data
    for name in zf.namelist():
        assert order.tracking_token not in zf.read(name).decode()


def test_the_same_order_gives_the_same_bytes_later_and_a_new_event_changes_them(make_order):
    order = _paid_and_seen(make_order())
    first = dossier_bytes(order=order)

    # An hour later, by every clock the build could read: nothing of "now" is in the zip.
    later = time.time() + 3600
    with (
        mock.patch("time.time", return_value=later),
        mock.patch("django.utils.timezone.now", return_value=datetime.fromtimestamp(later, UTC)),
    ):
        again = dossier_bytes(order=Order.objects.get(pk=order.pk))
    assert again == first

    order_services.order_confirm_payment(order=order, actor="staff:bob", note="6 confirmations")
    changed = dossier_bytes(order=order)
    assert changed != first
    assert _order_json(changed)["events"][-1]["to"] == "confirmed"


def test_entries_are_dated_by_the_order_and_readable_by_everyone(make_order):
    order = make_order()
    zf = _open(dossier_bytes(order=order))
    created = order.created_at.astimezone(UTC)
    for info in zf.infolist():
        assert info.date_time[:5] == (
            created.year,
            created.month,
            created.day,
            created.hour,
            created.minute,
        )
        assert (info.external_attr >> 16) & 0o777 == 0o644
        assert info.compress_type == zipfile.ZIP_DEFLATED

    # A zip cannot store dates before 1980: an older timestamp is clamped, not refused.
    Order.objects.filter(pk=order.pk).update(created_at=datetime(1970, 1, 1, tzinfo=UTC))
    old = _open(dossier_bytes(order=Order.objects.get(pk=order.pk)))
    assert {info.date_time for info in old.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_a_linked_campaign_adds_its_manifest_errors_batches_and_versions(
    make_order, make_campaign, output_root, run_here, corpus
):
    campaign = make_campaign("texts", batch_size=8)
    run_here(campaign)
    order = make_order()
    order.campaign = campaign
    order.save()

    zf = _open(dossier_bytes(order=order))

    assert zf.testzip() is None  # every entry's CRC checks out
    assert zf.namelist() == [
        "README.txt",
        "order.json",
        "campaign/manifest.csv",
        "campaign/parameter_versions.json",
        "campaign/batches.csv",
        "campaign/errors.csv",
        "campaign/estimate.json",
    ]
    assert json.loads(zf.read("order.json"))["campaign"] == "texts"

    manifest = _csv_rows(zf, "campaign/manifest.csv")
    assert list(manifest[0]) == ["id", "path", "size", "sha256"]
    assert len(manifest) == DEMO_GOOD + DEMO_BAD
    assert [row["id"] for row in manifest] == sorted(row["id"] for row in manifest)
    for row in manifest:
        content = (corpus / row["path"]).read_bytes()
        assert row["sha256"] == hashlib.sha256(content).hexdigest(), row["path"]
        assert int(row["size"]) == len(content)

    errors = _csv_rows(zf, "campaign/errors.csv")
    assert len(errors) == DEMO_BAD
    expected = {
        u.uid: (u.source_path, u.error_class)
        for u in Unit.objects.filter(campaign=campaign, state="failed")
    }
    assert {row["id"]: (row["path"], row["error_class"]) for row in errors} == expected
    assert all(row["path"].startswith("bad/") for row in errors)
    assert all(row["state"] == "failed" and row["error_message"] for row in errors)
    assert {row["error_class"] for row in errors} == {"input_invalid"}

    batches = _csv_rows(zf, "campaign/batches.csv")
    ran = Batch.objects.filter(campaign=campaign).order_by("pk")
    assert len(batches) == ran.count() > 1
    label = campaign.current_version.label
    for row, batch in zip(batches, ran, strict=True):
        assert row["id"] == str(batch.pk)
        assert (row["version"], row["state"], row["size"]) == (label, "done", str(batch.size))
        assert datetime.fromisoformat(row["finished_at"]) == batch.finished_at
    assert sum(int(row["size"]) for row in batches) == DEMO_GOOD + DEMO_BAD

    versions = json.loads(zf.read("campaign/parameter_versions.json"))["versions"]
    assert [(v["number"], v["label"]) for v in versions] == [(1, label)]
    assert versions[0]["fingerprint"] == campaign.current_version.fingerprint
    assert versions[0]["params"]["max_tokens"] == 256
    assert "torch" in versions[0]["software"]

    assert json.loads(zf.read("campaign/estimate.json")) == {
        "estimate": None,
        "note": "no profile has been run for this campaign",
    }


def test_the_stored_dossier_is_kept_by_reference_and_regenerates_to_the_same_file(
    make_order, dossier_root
):
    order = _paid_and_seen(make_order())

    path = dossier_store(order=order)

    assert path == dossier_root / f"{order.reference}.zip"
    first = hashlib.sha256(path.read_bytes()).hexdigest()
    assert path.read_bytes() == dossier_bytes(order=order)
    # No temp file left behind: the zip and the record of what it was built from.
    assert sorted(dossier_root.iterdir()) == [path, path.with_name(f"{path.name}.fingerprint")]

    # Clocks move on, the data does not: the regenerated file is the same file.
    Order.objects.filter(pk=order.pk).update(updated_at=order.updated_at + timedelta(days=1))
    again = dossier_store(order=Order.objects.get(pk=order.pk))
    assert again == path
    assert hashlib.sha256(again.read_bytes()).hexdigest() == first


def test_the_campaign_profile_and_estimate_go_into_the_order_dossier(
    make_order, make_campaign, catalog
):
    from campaigns.models import Profile
    from campaigns.profiles.estimates import estimate_build
    from campaigns.runs import costs

    campaign = make_campaign()
    costs.measure_costs(
        campaign=campaign, params=campaign.current_version.params, pending_only=False
    )
    mib = 1024 * 1024
    steps = [
        {
            "phase": phase,
            "batch_size": n,
            "compute_s": 0.01 * n * (8 if phase == "heaviest" else 1),
            "prepare_s": 0.001 * n,
            "padded": n * (256 if phase == "heaviest" else 30),
            "real": n * 30,
            "peak_allocated": 600 * mib,
            "peak_reserved": 600 * mib + n * mib,
            "fits": True,
            "write_s_per_item": 0.001,
            "output_bytes_per_item": 1664,
        }
        for phase in ("count", "heaviest")
        for n in (1, 2, 4, 8)
    ]
    profile = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.DONE,
        sample=list(campaign.units.values_list("pk", flat=True)[:10]),
        device="CPU (2 threads)",
        runtime={"torch": "2.13.0+cpu"},
        memory_budget=2048 * mib,
        steps=steps,
        chosen_batch_size=8,
        chosen_peak_reserved=608 * mib,
    )
    estimate_build(profile=profile)
    order = make_order()
    order.campaign = campaign
    order.save()

    estimate = json.loads(_open(dossier_bytes(order=order)).read("campaign/estimate.json"))

    assert estimate["chosen_batch_size"] == 8
    assert estimate["estimate"]["units"] == campaign.units.count()
    assert estimate["estimate"]["plan"]["duration_days"] in (3, 7, 30)
    assert estimate["sized_on"] == "the latest profile finished before the order"

    # A profile run after the order does not rewrite what it was sized on,
    # nor does one the order was made from lose to a newer one.
    later = Profile.objects.create(
        **{
            f.name: getattr(profile, f.name)
            for f in Profile._meta.concrete_fields
            if f.name not in ("id", "created_at")
        }
        | {"chosen_batch_size": 4}
    )
    estimate_build(profile=later)
    estimate = json.loads(_open(dossier_bytes(order=order)).read("campaign/estimate.json"))
    assert estimate["chosen_batch_size"] == 8
    order.profile = later
    order.save()
    estimate = json.loads(_open(dossier_bytes(order=order)).read("campaign/estimate.json"))
    assert (estimate["chosen_batch_size"], estimate["sized_on"]) == (
        4,
        "the profile the order was made from",
    )


def test_a_linked_campaign_dossier_is_the_same_bytes_later_and_changes_with_the_campaign(
    make_order, make_campaign, output_root, run_here, owner
):
    from campaigns.review.queue import unit_flag

    campaign = make_campaign("texts", batch_size=8)
    run_here(campaign)
    order = make_order()
    order.campaign = campaign
    order.save()
    first = dossier_bytes(order=Order.objects.get(pk=order.pk))

    # An hour later, by every clock the build could read: nothing of "now" is in the zip.
    later = time.time() + 3600
    with (
        mock.patch("time.time", return_value=later),
        mock.patch("django.utils.timezone.now", return_value=datetime.fromtimestamp(later, UTC)),
    ):
        again = dossier_bytes(order=Order.objects.get(pk=order.pk))
    assert again == first

    # A unit flagged for review is in errors.csv from then on.
    unit = Unit.objects.filter(campaign=campaign, state="succeeded").order_by("uid").first()
    unit_flag(unit=unit, user=owner, note="looks truncated")
    changed = dossier_bytes(order=Order.objects.get(pk=order.pk))
    assert changed != first
    flagged = _csv_rows(_open(changed), "campaign/errors.csv")
    assert unit.uid in {row["id"] for row in flagged}


# --- downloads: the kept zip while nothing changed ------------------------------------


@pytest.fixture
def builds():
    """Counts the dossier builds (dossier_bytes calls), whoever makes them."""
    with mock.patch.object(dossier, "dossier_bytes", wraps=dossier.dossier_bytes) as spy:
        yield spy


def _download(client, order: Order) -> bytes:
    response = client.get(f"/order/t/{order.tracking_token}/dossier.zip")
    assert response.status_code == 200, response.status_code
    assert response["Content-Disposition"].endswith(f'filename="{order.reference}-dossier.zip"')
    return b"".join(response.streaming_content)


def test_two_downloads_give_the_same_bytes_and_the_second_is_not_rebuilt(
    client, make_order, dossier_root, builds
):
    order = _paid_and_seen(make_order())

    first = _download(client, order)
    second = _download(client, order)

    assert builds.call_count == 1  # the first download built it; the second sent the kept zip
    assert first == second == dossier_bytes(order=order)
    assert (dossier_root / f"{order.reference}.zip").read_bytes() == first


def test_a_new_event_rebuilds_the_kept_dossier(client, make_order, dossier_root, builds):
    order = _paid_and_seen(make_order())
    first = _download(client, order)

    order_services.order_confirm_payment(order=order, actor="staff:bob", note="6 confirmations")
    second = _download(client, order)

    assert builds.call_count == 2
    assert second != first
    assert _order_json(second)["events"][-1]["to"] == "confirmed"


def test_a_change_in_the_linked_campaign_rebuilds_the_kept_dossier(
    client, make_order, make_campaign, output_root, run_here, owner, dossier_root, builds
):
    from campaigns.review.queue import unit_flag

    campaign = make_campaign("texts", batch_size=8)
    run_here(campaign)
    order = make_order()
    order.campaign = campaign
    order.save()
    first = _download(client, order)
    assert _download(client, order) == first
    assert builds.call_count == 1

    unit = Unit.objects.filter(campaign=campaign, state="succeeded").order_by("uid").first()
    unit_flag(unit=unit, user=owner, note="looks truncated")
    second = _download(client, order)

    assert builds.call_count == 2
    assert unit.uid in {row["id"] for row in _csv_rows(_open(second), "campaign/errors.csv")}


def test_a_kept_zip_that_was_altered_is_rebuilt_not_sent(client, make_order, dossier_root, builds):
    order = make_order()
    good = _download(client, order)
    (dossier_root / f"{order.reference}.zip").write_bytes(b"PK not the dossier")

    assert _download(client, order) == good
    assert builds.call_count == 2


def test_dossier_downloads_are_rate_limited_per_client(client, make_order, dossier_root, settings):
    settings.ORDER_DOSSIER_RATE = "2/m"
    order = make_order()
    for _ in range(2):
        _download(client, order)
    blocked = client.get(f"/order/t/{order.tracking_token}/dossier.zip")
    assert blocked.status_code == 429
    assert "Too many requests" in blocked.content.decode()
