"""Set up the demo: a user, a project and a text-embedding campaign over the bundled corpus."""

from __future__ import annotations

from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from campaigns.models import Campaign
from campaigns.runs import setup, start


def demo_corpus() -> Path:
    """The corpus shipped with the campaigns app, which owns it."""
    return Path(apps.get_app_config("campaigns").path) / "demo_corpus"


DEMO_USER, DEMO_PASSWORD = "demo", "demo-briefgpu"
DEMO_CAMPAIGN = "demo-embeddings"
DEMO_STAFF, DEMO_STAFF_PASSWORD = "staff", "staff-briefgpu"
# Demo rates (fiat per coin); staff record real ones in the admin.
DEMO_RATES = {"BTC": "60000", "LTC": "80", "XMR": "150"}


class Command(BaseCommand):
    help = "Create the demo user, project and campaign (idempotent) and enqueue what is left."

    def add_arguments(self, parser):
        parser.add_argument("--no-run", action="store_true", help="do not enqueue the units")
        parser.add_argument(
            "--force",
            action="store_true",
            help="run with DEBUG off too (fake payment addresses and public passwords)",
        )

    def handle(self, *args, no_run: bool, force: bool = False, **options):
        if not settings.DEBUG and not force:
            # DEBUG off is how production runs: the demo would put placeholder
            # payment addresses, demo rates and accounts whose passwords are
            # printed in the README into a database real customers use.
            raise CommandError(
                "DEBUG is off: this looks like production, and the demo would add fake "
                "payment addresses, demo rates and the accounts demo / staff with public "
                "passwords. Nothing was changed. Run it on a development database, or "
                "pass --force if this one is a throwaway."
            )
        User = get_user_model()
        user = User.objects.filter(username=DEMO_USER).first()
        if user is None:
            user = User.objects.create_user(DEMO_USER, password=DEMO_PASSWORD)
        project = setup.project_for_user(name="demo", user=user)
        campaign = Campaign.objects.filter(name=DEMO_CAMPAIGN).first()
        if campaign is None:
            campaign, report = setup.campaign_create(
                name=DEMO_CAMPAIGN,
                processor="text-embedding",
                project=project,
                input_folder=demo_corpus(),
                # The processor's defaults, as a user who changes nothing gets
                # them: the fast path (docs/processors.md).
                params={},
            )
            self.stdout.write(f"created {campaign.name}: {report.created} units")
        if not no_run:
            with start.broker_outage_noted() as outage:
                batches = start.campaign_run(campaign=campaign)
            self.stdout.write(f"enqueued {batches} batches")
            if outage:
                # The rest of the demo needs no broker: set it up all the same.
                self.stderr.write(start.broker_outage_reason(outage))
        self._ordering_demo(User)
        self.stdout.write(f"log in as {DEMO_USER} / {DEMO_PASSWORD}")
        self.stdout.write(f"staff (verification queue): {DEMO_STAFF} / {DEMO_STAFF_PASSWORD}")

    def _ordering_demo(self, User) -> None:
        """Rates stamped now and a pool of demo addresses, so /order/ can quote at once.

        The addresses are placeholders that no wallet accepts: a real shop loads
        its own pool and records its rates in the admin.
        """
        from decimal import Decimal

        from django.utils import timezone

        from portal.models import CryptoCurrency, ExchangeRate, PaymentAddress
        from portal.staff_group import staff_group_sync

        staff = User.objects.filter(username=DEMO_STAFF).first()
        if staff is None:
            staff = User.objects.create_user(
                DEMO_STAFF, password=DEMO_STAFF_PASSWORD, is_staff=True
            )
        # The documented staff tasks (verification, rates, addresses) need the
        # group's permissions: `is_staff` alone gets 403 on those admin pages.
        staff.groups.add(staff_group_sync())
        now = timezone.now()
        for currency in CryptoCurrency.objects.filter(code__in=DEMO_RATES):
            ExchangeRate.objects.create(
                currency=currency, fiat_per_unit=Decimal(DEMO_RATES[currency.code]), recorded_at=now
            )
            free = PaymentAddress.objects.filter(currency=currency, order__isnull=True).count()
            start = PaymentAddress.objects.filter(currency=currency).count()
            PaymentAddress.objects.bulk_create(
                PaymentAddress(currency=currency, address=f"DEMO-{currency.code}-{i:04d}")
                for i in range(start, start + max(0, 20 - free))
            )
        self.stdout.write("ordering demo: rates recorded now, demo address pools filled")
