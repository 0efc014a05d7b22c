from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")

# kombu's filesystem transport expects its folders to exist.
for folder in (app.conf.broker_transport_options or {}).values():
    if isinstance(folder, str) and folder.startswith("/"):
        Path(folder).mkdir(parents=True, exist_ok=True)
