"""Login lockouts with two limits (django-axes, on the site's and the admin's login).

- LOGIN_FAILURE_LIMIT (AXES_FAILURE_LIMIT) wrong passwords for one username
  from one client lock that pair: a forgotten password locks one account
  there, not everyone behind the same address.
- LOGIN_ADDRESS_FAILURE_LIMIT wrong passwords from one client, whatever the
  usernames, lock the client: one guess for each of many usernames never
  reaches the first limit.

django-axes compares every lockout parameter (AXES_LOCKOUT_PARAMETERS) with one
limit; this handler keeps its records and lockout flow and answers
`get_failures` on the pair's scale, reaching the pair's limit once the address
reached its own. The client is portal.client_ip.client_network (an IPv6
client by its /64).
"""

from __future__ import annotations

from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import QuerySet, Sum


class LoginThrottleHandler(AxesDatabaseHandler):
    def get_failures(self, request, credentials: dict | None = None) -> int:
        by_address, by_pair = self._recent(request, credentials)
        if _failures(by_address) >= settings.LOGIN_ADDRESS_FAILURE_LIMIT:
            # Read by the lockout page (templates/registration/locked_out.html).
            request.login_address_locked = True
            return max(_failures(by_pair), get_failure_limit(request, credentials))
        return _failures(by_pair)

    def reset_user_attempts(self, request, credentials: dict | None = None) -> int:
        """A successful login clears its own username's failures at this
        address, never the address's others: logging into an account of one's
        own between guesses must not wipe the count of the guesses."""
        _, by_pair = self._recent(request, credentials)
        count, _ = by_pair.delete()
        return count

    def _recent(
        self, request, credentials: dict | None
    ) -> tuple[QuerySet[AccessAttempt], QuerySet[AccessAttempt]]:
        """This client's failures within the cool-off, and those of its username."""
        recent = AccessAttempt.objects.filter(
            ip_address=request.axes_ip_address,
            attempt_time__gte=get_cool_off_threshold(request),
        )
        username = get_client_username(request, credentials)
        return recent, recent.filter(username=username)


def _failures(attempts: QuerySet[AccessAttempt]) -> int:
    return attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
