"""The BTCPay Server webhook endpoint: HTTP in and out; portal/btcpay.py decides."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal import btcpay

log = logging.getLogger(__name__)


# BTCPay Server posts from its own server with no browser session or CSRF
# cookie; the HMAC in BTCPay-Sig authenticates every delivery instead.
@csrf_exempt
@require_POST
def btcpay_webhook(request: HttpRequest) -> JsonResponse:
    try:
        body = request.body
    except RequestDataTooBig:
        # BTCPay's deliveries are a few hundred bytes: anything past Django's
        # DATA_UPLOAD_MAX_MEMORY_SIZE is not one. Refused in one line, without
        # the traceback Django's own handler would log as an ERROR.
        log.warning(
            "BTCPay webhook: body over %d bytes refused (413)",
            settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
        )
        return JsonResponse({"detail": "body too large"}, status=413)
    result = btcpay.handle_delivery(
        body=body, signature_header=request.headers.get("BTCPay-Sig", "")
    )
    return JsonResponse({"detail": result.message}, status=result.status)
