"""A throw-away Django for a benchmark script: its own folder, SQLite and outputs.

from bench.django_env import setup
work = setup("bench-profile-")      # then import campaigns, gpuworker, …
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def setup(prefix: str, database_url: str = "") -> Path:
    """database_url: run on this database instead of a fresh SQLite file; it is
    EMPTIED first (flush): give one of its own."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ.update(
        {
            "VAR_DIR": str(work / "var"),
            "OUTPUT_ROOT": str(work / "outputs"),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    # As a deployed worker runs (docs/deployment.md): DEBUG on logs every
    # query and quotes its parameters, ~5% of the worker's time outside the model.
    os.environ.setdefault("DEBUG", "0")
    # The embedded default: a benchmark never writes to a configured database.
    os.environ.pop("DATABASE_URL", None)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if database_url:
        call_command("flush", interactive=False, verbosity=0)
    return work
