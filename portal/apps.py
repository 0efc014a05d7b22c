"""The portal app: its system checks, its staff group, and the rental advisor campaigns asks."""

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class PortalConfig(AppConfig):
    name = "portal"

    def ready(self) -> None:
        from campaigns.profiles.advice import advisor_register
        from campaigns.watch.rentals import rentals_register
        from portal import checks  # noqa: F401  (registers the system checks)
        from portal.advice import PortalAdvisor
        from portal.rentals import PortalRentals
        from portal.staff_group import staff_group_sync

        # After auth's own handler has created this app's permissions.
        post_migrate.connect(staff_group_sync, sender=self, dispatch_uid="portal-staff-group")

        # Estimates and the profile page (campaigns) price plans through this;
        # every process that loads Django loads portal, so each has it.
        advisor_register(PortalAdvisor())
        # The watch panel and the rental-ending alert ask campaigns' rental this way.
        rentals_register(PortalRentals())
