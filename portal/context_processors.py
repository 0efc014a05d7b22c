"""What every page's template gets beside the request."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def operator(request: HttpRequest) -> dict:
    """The operator's name and contact: every page's footer names them."""
    return {
        "operator": {
            "name": settings.OPERATOR_NAME,
            "email": settings.OPERATOR_EMAIL,
            "address": settings.OPERATOR_ADDRESS,
            "registration": settings.OPERATOR_REGISTRATION,
        }
    }
