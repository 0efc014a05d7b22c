"""Which address a rate limit counts a client by, behind a reverse proxy.

django-ratelimit reads RATELIMIT_IP_META_KEY (portal/settings.py): a request
header such as HTTP_X_REAL_IP, or the dotted path of a function taking the
request, such as `forwarded_for` below, and counts an IPv6 client by its /64
(RATELIMIT_IPV6_MASK; IPv4 by the whole address, RATELIMIT_IPV4_MASK): one
customer's line or one cloud machine is given a whole /64, so its addresses
are one client. django-axes (login lockouts) and the caps on open orders ask
`client_network`, which reads the same settings, so all three count the same
client.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest
from django.utils.module_loading import import_string


def client_ip(request: HttpRequest) -> str:
    """The client's address as RATELIMIT_IP_META_KEY says to read it.

    Unset: REMOTE_ADDR; a request.META key: that header; a dotted path: what
    that function answers. A header the proxy did not set (a request that
    bypassed it) falls back on REMOTE_ADDR here: a login is refused or
    allowed by the lockout, never crashed.
    """
    key = getattr(settings, "RATELIMIT_IP_META_KEY", None)
    if key and "." in key:
        return import_string(key)(request)
    if key and key != "REMOTE_ADDR" and request.META.get(key):
        return request.META[key]
    return request.META.get("REMOTE_ADDR", "")


def client_network(request: HttpRequest) -> str:
    """The client as the rate limits count it: `client_ip`, an IPv6 address
    cut to its /64 (2001:db8:1:2::) as django-ratelimit's "ip" key does, with
    the same settings; an IPv4 address whole by default.

    Something that is not an address (an empty REMOTE_ADDR behind a Unix
    socket, say) is returned as it is: it still counts as one client.
    """
    address = client_ip(request)
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if parsed.version == 6:
        mask = getattr(settings, "RATELIMIT_IPV6_MASK", 64)
    else:
        mask = getattr(settings, "RATELIMIT_IPV4_MASK", 32)
    return str(ipaddress.ip_network(f"{parsed}/{mask}", strict=False).network_address)


def forwarded_for(request: HttpRequest) -> str:
    """The client's address as our own proxies saw it, from X-Forwarded-For.

    Each proxy appends the address it received the request from, so with N
    proxies of ours in front (RATELIMIT_TRUSTED_PROXIES) the N-th entry from
    the right is the client; entries further left were written by the client
    and can say anything. A request that did not cross all the proxies has
    fewer entries (all of them ours), and one that crossed none falls back on
    REMOTE_ADDR.
    """
    header = request.META.get("HTTP_X_FORWARDED_FOR", "")
    entries = [entry.strip() for entry in header.split(",") if entry.strip()]
    if entries:
        candidate = entries[max(0, len(entries) - settings.RATELIMIT_TRUSTED_PROXIES)]
        # Not an address (a misconfigured proxy): count by the peer instead.
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(candidate))
    return request.META["REMOTE_ADDR"]


def client_key(request: HttpRequest) -> str:
    """A keyed hash of the client the rate limits count (`client_network`: the
    same proxy settings, an IPv6 client by its /64), hashed with SECRET_KEY so
    an order row never stores a client's address."""
    address = client_network(request)
    return hmac.new(settings.SECRET_KEY.encode(), address.encode(), hashlib.sha256).hexdigest()[:32]
