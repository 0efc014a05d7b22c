"""The portal app: its system checks, and the rental advisor campaigns asks."""

from __future__ import annotations

from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"

    def ready(self) -> None:
        from campaigns.profiles.advice import advisor_register
        from portal import checks  # noqa: F401  (registers the system checks)
        from portal.advice import PortalAdvisor

        # Estimates and the profile page (campaigns) price plans through this;
        # every process that loads Django loads portal, so each has it.
        advisor_register(PortalAdvisor())
