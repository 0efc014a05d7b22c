"""Which campaign a request may see: the one rule every campaigns view starts from."""

from __future__ import annotations

from django.http import Http404, HttpRequest

from campaigns import selectors
from campaigns.models import Campaign


def campaign_for_user_or_404(request: HttpRequest, name: str) -> Campaign:
    """The campaign if the user may see it; outsiders get the same 404 as a wrong name."""
    campaign = selectors.campaign_for_user(user=request.user, name=name)
    if campaign is None:
        raise Http404("No such campaign.")
    return campaign
