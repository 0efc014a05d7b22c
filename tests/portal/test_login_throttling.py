"""Login throttling (django-axes) on the site's and the admin's login, and what
a staff account may do: its group's permissions, not `is_staff` alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group

from portal.order_states import Status
from portal.staff_group import STAFF_GROUP, STAFF_PERMISSIONS
from tests.conftest import UserFactory

SITE, ADMIN = "/accounts/login/", "/admin/login/"


def _login(client, url: str, password: str, **headers):
    return client.post(url, {"username": "alice", "password": password}, **headers)


@pytest.fixture
def alice(db):
    return UserFactory(username="alice", is_staff=True, is_superuser=True)


@pytest.mark.parametrize("url", [SITE, ADMIN])
def test_wrong_passwords_lock_the_username_at_that_address(client, alice, settings, url):
    settings.AXES_FAILURE_LIMIT = 5
    for _ in range(4):
        assert _login(client, url, "guess").status_code == 200  # the form again
    assert _login(client, url, "guess").status_code == 429  # the fifth locks
    # then the right password is refused too, with a readable page
    locked = _login(client, url, "pw-for-tests")
    assert locked.status_code == 429
    page = locked.content.decode()
    assert "Too many wrong passwords" in page and "alice" in page
    assert "_auth_user_id" not in client.session
    # another address is not locked out
    other = _login(client, url, "pw-for-tests", REMOTE_ADDR="198.51.100.9")
    assert other.status_code == 302


def _guess(client, url: str, username: str, **headers):
    return client.post(url, {"username": username, "password": "guess"}, **headers)


@pytest.mark.parametrize("url", [SITE, ADMIN])
def test_wrong_passwords_for_many_usernames_lock_the_address(client, alice, settings, url):
    # As reported, the other way round: one guess per username never reaches
    # the per-username limit, so the address has a limit of its own.
    settings.AXES_FAILURE_LIMIT = 5
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 12
    for n in range(11):
        assert _guess(client, url, f"user{n}").status_code == 200
    assert _guess(client, url, "user11").status_code == 429  # the twelfth locks
    # then every username from that address is refused, alice's right password too
    locked = _login(client, url, "pw-for-tests")
    assert locked.status_code == 429
    assert "from your address" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    # another address is not locked out
    assert _login(client, url, "pw-for-tests", REMOTE_ADDR="198.51.100.9").status_code == 302


def test_an_ipv6_client_is_one_address_across_its_64(client, alice, settings):
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 6
    for n in range(6):
        _guess(client, SITE, f"user{n}", REMOTE_ADDR=f"2001:db8:1:2::{n + 1}")
    assert _login(client, SITE, "pw-for-tests", REMOTE_ADDR="2001:db8:1:2::99").status_code == 429
    assert _login(client, SITE, "pw-for-tests", REMOTE_ADDR="2001:db8:1:3::1").status_code == 302


def test_logging_into_one_account_does_not_clear_the_address_s_count(client, alice, settings):
    # An attacker with an account of their own cannot wipe the address's
    # failures by logging into it between guesses.
    settings.AXES_FAILURE_LIMIT = 5
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 6
    for n in range(5):
        _guess(client, SITE, f"user{n}")
    assert _login(client, SITE, "pw-for-tests").status_code == 302  # alice, 5 < 6
    client.logout()
    assert _guess(client, SITE, "user5").status_code == 429  # the sixth locks
    assert _login(client, SITE, "pw-for-tests").status_code == 429


def test_the_lock_lifts_after_the_cool_off(client, alice, settings):
    from axes.models import AccessAttempt

    settings.AXES_FAILURE_LIMIT = 3
    for _ in range(3):
        _login(client, SITE, "guess")
    assert _login(client, SITE, "pw-for-tests").status_code == 429
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time
        - settings.AXES_COOLOFF_TIME
        - timedelta(seconds=1)
    )
    assert _login(client, SITE, "pw-for-tests").status_code == 302


def test_behind_a_proxy_the_lockout_counts_the_proxy_s_client(client, alice, settings):
    # The same address logic as the rate limits: X-Real-IP set by nginx.
    settings.RATELIMIT_IP_META_KEY = "HTTP_X_REAL_IP"
    settings.AXES_FAILURE_LIMIT = 3
    attacker, owner = {"HTTP_X_REAL_IP": "203.0.113.7"}, {"HTTP_X_REAL_IP": "198.51.100.9"}
    for _ in range(3):
        _login(client, SITE, "guess", **attacker)
    assert _login(client, SITE, "pw-for-tests", **attacker).status_code == 429
    # every request comes from the proxy's REMOTE_ADDR, yet the owner still logs in
    assert _login(client, SITE, "pw-for-tests", **owner).status_code == 302


def test_a_staff_login_without_the_group_cannot_confirm_payments(client, make_order):
    order = make_order()
    bare = UserFactory(username="bare-staff", is_staff=True)
    client.force_login(bare)
    assert client.get("/order/staff/").status_code == 403
    response = client.post(
        f"/order/staff/{order.pk}/action/", {"action": "confirm", "note": "looks fine"}
    )
    assert response.status_code == 403
    order.refresh_from_db()
    assert order.status == Status.AWAITING_PAYMENT


def test_the_staff_group_holds_exactly_the_documented_permissions(db):
    group = Group.objects.get(name=STAFF_GROUP)
    held = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()}
    assert held == set(STAFF_PERMISSIONS)
    # no catalog edits, no raw order edits through other models, no user admin
    assert "portal.change_gpumodel" not in held
    assert not any(p.startswith("auth.") for p in held)
