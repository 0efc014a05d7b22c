"""Set up the demo: a user, a project and a text-embedding campaign over the bundled corpus."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from campaigns import services
from campaigns.models import Campaign

DEMO_CORPUS = Path(__file__).resolve().parents[2] / "demo_corpus"
DEMO_USER, DEMO_PASSWORD = "demo", "demo-briefgpu"
DEMO_CAMPAIGN = "demo-embeddings"


class Command(BaseCommand):
    help = "Create the demo user, project and campaign (idempotent) and enqueue what is left."

    def add_arguments(self, parser):
        parser.add_argument("--no-run", action="store_true", help="do not enqueue the units")

    def handle(self, *args, no_run: bool, **options):
        User = get_user_model()
        user = User.objects.filter(username=DEMO_USER).first()
        if user is None:
            user = User.objects.create_user(DEMO_USER, password=DEMO_PASSWORD)
        project = services.project_for_user(name="demo", user=user)
        campaign = Campaign.objects.filter(name=DEMO_CAMPAIGN).first()
        if campaign is None:
            campaign, report = services.campaign_create(
                name=DEMO_CAMPAIGN,
                processor="text-embedding",
                project=project,
                input_folder=DEMO_CORPUS,
                params={"batch_size": 4},
            )
            self.stdout.write(f"created {campaign.name}: {report.created} units")
        if not no_run:
            batches = services.campaign_run(campaign=campaign)
            self.stdout.write(f"enqueued {batches} batches")
        self.stdout.write(f"log in as {DEMO_USER} / {DEMO_PASSWORD}")
