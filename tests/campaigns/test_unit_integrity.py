"""A unit always belongs to an existing campaign, on both databases.

SQLite enforces it with its declared foreign key; PostgreSQL with the
statement-level triggers of migration 0013 (one check per statement instead of
one per imported row). The same assertions run on both (CI runs the suite on
each), plus, on PostgreSQL, the race a foreign key's row lock settles.
"""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction

from campaigns import selectors
from campaigns.models import Campaign, Project, Unit, UnitState

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks between two connections"
)


def _campaign(name: str = "c") -> Campaign:
    project, _ = Project.objects.get_or_create(name="p")
    return Campaign.objects.create(project=project, name=name, processor="x", input_root="/")


def test_a_unit_of_a_campaign_that_does_not_exist_is_refused():
    campaign = _campaign()
    missing = campaign.pk + 1000
    with pytest.raises(IntegrityError), transaction.atomic():
        Unit.objects.bulk_create(
            [
                Unit(campaign=campaign, uid="ok", source_path="ok"),
                Unit(campaign_id=missing, uid="orphan", source_path="orphan"),
            ]
        )
    assert Unit.objects.count() == 0


def test_moving_a_unit_to_a_campaign_that_does_not_exist_is_refused():
    campaign = _campaign()
    unit = Unit.objects.create(campaign=campaign, uid="u", source_path="u")
    with pytest.raises(IntegrityError), transaction.atomic():
        Unit.objects.filter(pk=unit.pk).update(campaign_id=campaign.pk + 1000)
    assert Unit.objects.get(pk=unit.pk).campaign_id == campaign.pk


def test_a_campaign_row_with_units_cannot_be_deleted_behind_the_orm():
    campaign = _campaign()
    Unit.objects.create(campaign=campaign, uid="u", source_path="u")
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM campaigns_campaign WHERE id = %s", [campaign.pk])
    assert Campaign.objects.filter(pk=campaign.pk).exists()


def test_deleting_a_campaign_deletes_its_units_and_their_counts():
    kept, gone = _campaign("kept"), _campaign("gone")
    for campaign in (kept, gone):
        Unit.objects.bulk_create(
            Unit(campaign=campaign, uid=f"u{i}", source_path=f"u{i}") for i in range(5)
        )
    gone.delete()
    assert Unit.objects.filter(campaign_id=gone.pk).count() == 0
    assert selectors.campaign_counts(campaign=kept).pending == 5


@postgresql_only
def test_an_import_and_a_deletion_of_its_campaign_at_once_leave_no_orphan():
    """The import's statement locks the campaign row FOR KEY SHARE, as a foreign
    key would: the deletion waits for the import's commit, then finds units and
    fails; the import's units stay with their campaign."""
    campaign = _campaign()
    imported = threading.Event()
    outcome: dict[str, object] = {}

    def importer() -> None:
        try:
            with transaction.atomic():
                Unit.objects.bulk_create(
                    Unit(campaign_id=campaign.pk, uid=f"u{i}", source_path=f"u{i}")
                    for i in range(100)
                )
                imported.set()
                # Hold the transaction open while the deletion tries its luck.
                with connections["default"].cursor() as cursor:
                    cursor.execute("SELECT pg_sleep(1)")
            outcome["import"] = "committed"
        except BaseException as exc:  # reported by the main thread
            outcome["import"] = exc
            imported.set()
        finally:
            connections.close_all()

    def deleter() -> None:
        imported.wait(20)
        try:
            with transaction.atomic(), connections["default"].cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '20s'")
                cursor.execute("DELETE FROM campaigns_campaign WHERE id = %s", [campaign.pk])
            outcome["delete"] = "committed"
        except IntegrityError as exc:
            outcome["delete"] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=importer), threading.Thread(target=deleter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert outcome["import"] == "committed"
    assert isinstance(outcome["delete"], IntegrityError)
    assert "still has units" in str(outcome["delete"])
    assert Unit.objects.filter(campaign_id=campaign.pk, state=UnitState.PENDING).count() == 100
