"""`make run`'s demo campaign: what a user who changes nothing gets."""

from __future__ import annotations

from django.core.management import call_command

from campaigns.models import Campaign
from campaigns.specs.builtin import TEXT_EMBEDDING


def test_the_demo_campaign_runs_on_the_processors_defaults(db, settings):
    # The defaults are the fast path (docs/processors.md): the demo shows them.
    settings.DEBUG = True  # the development database it is made for
    call_command("demo", "--no-run")
    params = Campaign.objects.get(name="demo-embeddings").current_version.params
    assert params == TEXT_EMBEDDING.clean({})
    assert (params["batch_policy"], params["token_budget"]) == ("token_budget", 4096)
