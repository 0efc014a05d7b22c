"""The BTCPay Server webhook endpoint: HTTP in and out; portal/btcpay.py decides."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal import btcpay


# BTCPay Server posts from its own server with no browser session or CSRF
# cookie; the HMAC in BTCPay-Sig authenticates every delivery instead.
@csrf_exempt
@require_POST
def btcpay_webhook(request: HttpRequest) -> JsonResponse:
    result = btcpay.handle_delivery(
        body=request.body, signature_header=request.headers.get("BTCPay-Sig", "")
    )
    return JsonResponse({"detail": result.message}, status=result.status)
