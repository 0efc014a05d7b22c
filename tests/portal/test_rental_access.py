"""A paid rental a customer can use: keys, folders and batch list in; host, port,
user and notebook out, on the tracking page only; the reminder before the end."""

from __future__ import annotations

import posixpath
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from portal import access
from portal import order_services as svc
from portal.models import Environment, GpuModel, Order, RentalAccess, RentalDuration
from portal.order_states import Status, TransitionRefused
from tests.conftest import UserFactory
from tests.portal.test_ssh_keys import (
    ED25519,
    ED25519_FINGERPRINT,
    RSA_1024,
    RSA_2048,
    RSA_2048_FINGERPRINT,
)

NOTEBOOK_TOKEN = "nb-token-8f3a1c5e9b"


# --- the order form ---------------------------------------------------------------------


def _post_data(**overrides) -> dict:
    from portal.models import CryptoCurrency

    data = {
        "gpu": GpuModel.objects.get(name="L40S").pk,
        "quantity": 1,
        "duration": RentalDuration.objects.get(days=7).pk,
        "environment": Environment.objects.first().pk,
        "first_name": "Grace",
        "last_name": "Hopper",
        "email": "grace@example.org",
        "currency": CryptoCurrency.objects.get(code="BTC").pk,
        "ssh_keys": ED25519,
        "export_folders": "results",
    }
    data.update(overrides)
    return data


def test_an_order_keeps_its_keys_folders_and_batch_list(
    client, owner, make_campaign, fresh_rates, address_pool
):
    sized, extra = make_campaign("texts"), make_campaign("more-texts")
    client.force_login(owner)
    page = client.get("/order/", {"campaign": sized.name}).content.decode()
    assert 'name="campaigns"' in page and f'value="{extra.pk}"' in page

    response = client.post(
        "/order/",
        _post_data(
            campaign=sized.name,
            campaigns=[extra.pk],
            ssh_keys=f"  {RSA_2048}  \r\n\r\n{ED25519}\r\n",
            export_folders="results//run1/\n./exports\nresults/run1",
        ),
    )

    assert response.status_code == 302
    order = Order.objects.get()
    assert order.ssh_public_keys == [RSA_2048, ED25519]
    assert order.export_folders == ["results/run1", "exports"]
    assert order.campaign == sized
    assert set(order.campaigns.all()) == {sized, extra}
    assert order.batch_list() == ["texts", "more-texts"]


def test_a_campaign_the_user_may_not_see_cannot_join_the_batch_list(
    client, outsider, make_campaign, fresh_rates, address_pool
):
    foreign = make_campaign("someone-elses")
    client.force_login(outsider)
    page = client.post("/order/", _post_data(campaigns=[foreign.pk])).content.decode()
    assert "Select a valid choice" in page
    assert not Order.objects.exists()


@pytest.mark.parametrize(
    ("keys", "shown"),
    [
        ("", "Give at least one SSH public key"),
        (
            "ssh-ed25519 AAAA%%%%",
            "Line 1 is not a valid key: the part after the type is not base64",
        ),
        (f"{ED25519}\n{RSA_1024}", "Line 2 is an RSA key of 1024 bits"),
        (f"ssh-rsa {ED25519.split()[1]}", "Line 1 says ssh-rsa but the key inside is ssh-ed25519"),
        ("\n".join([ED25519] * 11), "11 keys given; an order takes at most 10."),
    ],
)
def test_the_form_refuses_bad_keys_beside_the_field_and_orders_nothing(
    client, fresh_rates, address_pool, keys, shown
):
    response = client.post("/order/", _post_data(ssh_keys=keys))
    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="error-ssh_keys"' in page
    assert shown in page.replace("&#x27;", "'")
    assert not Order.objects.exists()


def test_a_pasted_private_key_is_refused_and_never_shown_back(client, fresh_rates, address_pool):
    secret = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
    pasted = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{secret}\n-----END OPENSSH PRIVATE KEY-----"
    page = client.post("/order/", _post_data(ssh_keys=pasted)).content.decode()
    assert "is a private key. Never share it" in page
    assert secret not in page
    assert not Order.objects.exists()


@pytest.mark.parametrize(
    ("folder", "shown"),
    [
        ("../elsewhere", 'may not contain ".."'),
        ("results/../../etc", 'may not contain ".."'),
        ("/etc/cron.d", "must be relative to your home folder"),
        ("~/results", "must be relative to your home folder"),
        ("results\\run1", 'separate folders with "/"'),
        ("results/-rf", 'starting with "-"'),
        ("results\x1b[31m", "control characters"),
        ("\n".join(f"r{i}" for i in range(11)), "11 folders given; an order takes at most 10."),
    ],
)
def test_the_form_refuses_export_folders_outside_the_home_folder(
    client, fresh_rates, address_pool, folder, shown
):
    page = client.post("/order/", _post_data(export_folders=folder)).content.decode()
    assert 'id="error-export_folders"' in page
    assert shown in page.replace("&quot;", '"')
    assert not Order.objects.exists()


@given(st.text(max_size=300))
def test_an_export_folder_is_refused_or_stays_inside_the_home_folder(text):
    try:
        folder = access.export_folder(text)
    except access.FolderRefused:
        return
    assert posixpath.normpath(folder) == folder
    assert not folder.startswith(("/", "~", "-")) and ".." not in folder.split("/")


# --- staff provision and correct ----------------------------------------------------------


def _provisioning(make_order, **fields):
    fields.setdefault("ssh_public_keys", [ED25519])
    order = svc.order_confirm_payment(order=make_order(**fields), actor="staff:t", note="seen")
    return svc.order_start_provisioning(order=order, actor="staff:t")


GOOD_ACCESS = {
    "host": "gpu-7.example.net",
    "port": "2222",
    "username": "ada",
    "notebook_url": "https://gpu-7.example.net:8888/lab",
    "notebook_token": NOTEBOOK_TOKEN,
    "note": "",
}


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("host", "gpu-7.example.net; rm -rf ~", "Give a DNS name"),
        ("host", "-oProxyCommand=x", "Give a DNS name"),
        ("port", "0", "greater than or equal to 1"),
        ("port", "70000", "less than or equal to 65535"),
        ("username", "Ada Lovelace", "A user name of lower-case letters"),
        ("notebook_url", "javascript:alert(1)", "Enter a valid URL"),
        (
            "notebook_url",
            f"https://gpu-7.example.net:8888/lab?token={NOTEBOOK_TOKEN}",
            "Leave the token",
        ),
    ],
)
def test_provisioning_refuses_bad_access_and_changes_nothing(
    client, staff, make_order, field, value, shown
):
    order = _provisioning(make_order)
    client.force_login(staff)
    response = client.post(f"/order/staff/{order.pk}/access/", {**GOOD_ACCESS, field: value})
    assert response.status_code == 400
    assert shown in response.content.decode().replace("&#x27;", "'")
    order.refresh_from_db()
    assert order.status == Status.PROVISIONING
    assert not RentalAccess.objects.exists()


def test_a_notebook_token_needs_its_address(client, staff, make_order):
    order = _provisioning(make_order)
    client.force_login(staff)
    response = client.post(f"/order/staff/{order.pk}/access/", {**GOOD_ACCESS, "notebook_url": ""})
    assert "A token needs the notebook" in response.content.decode()
    assert not RentalAccess.objects.exists()


def test_provisioning_records_the_access_starts_the_rental_and_mails_no_secret(
    client, staff, make_order, mailoutbox, django_capture_on_commit_callbacks
):
    order = _provisioning(make_order)
    client.force_login(staff)
    mailoutbox.clear()

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/order/staff/{order.pk}/access/", GOOD_ACCESS)

    assert response.status_code == 302
    order.refresh_from_db()
    assert order.status == Status.ACTIVE
    assert order.ends_at - order.starts_at == timedelta(days=order.duration_days)
    saved = order.access
    assert (saved.host, saved.port, saved.username) == ("gpu-7.example.net", 2222, "ada")
    assert saved.notebook_token == NOTEBOOK_TOKEN
    event = order.events.last()
    assert (event.actor, event.to_status) == ("staff:staff", Status.ACTIVE)
    assert NOTEBOOK_TOKEN not in event.note and "gpu-7" not in event.note
    [mail] = mailoutbox
    assert mail.subject == f"Your order {order.reference}: your rental is active"
    assert "is ready" in mail.body
    assert f"/order/t/{order.tracking_token}/" in mail.body
    for secret in (NOTEBOOK_TOKEN, "ssh -p", "8888/lab"):
        assert secret not in mail.body


def test_provisioning_an_order_not_being_provisioned_is_refused(client, staff, make_order):
    order = svc.order_confirm_payment(order=make_order(), actor="staff:t", note="seen")
    client.force_login(staff)
    page = client.post(f"/order/staff/{order.pk}/access/", GOOD_ACCESS, follow=True)
    assert "cannot become active" in page.content.decode()
    order.refresh_from_db()
    assert order.status == Status.CONFIRMED
    assert not RentalAccess.objects.exists()


def test_the_mark_provisioned_action_without_access_is_gone(client, staff, make_order):
    order = _provisioning(make_order)
    client.force_login(staff)
    page = client.get(f"/order/staff/{order.pk}/").content.decode()
    assert 'value="provisioned"' not in page
    assert 'id="access-form"' in page
    client.post(f"/order/staff/{order.pk}/action/", {"action": "provisioned", "note": "x"})
    order.refresh_from_db()
    assert order.status == Status.PROVISIONING


def _active(make_order, **fields):
    order = _provisioning(make_order, **fields)
    details = access.AccessDetails(
        host="gpu-7.example.net",
        port=2222,
        username="ada",
        notebook_url="https://gpu-7.example.net:8888/lab",
        notebook_token=NOTEBOOK_TOKEN,
    )
    return access.access_provision(order=order, actor="staff:t", details=details)


def test_correcting_the_access_tells_the_customer_what_changed_never_the_values(
    client, staff, make_order, mailoutbox, django_capture_on_commit_callbacks
):
    order = _active(make_order)
    client.force_login(staff)
    page = client.get(f"/order/staff/{order.pk}/").content.decode()
    assert "Correct the access" in page and 'value="gpu-7.example.net"' in page
    mailoutbox.clear()

    corrected = {**GOOD_ACCESS, "host": "gpu-9.example.net", "notebook_token": "nb-new-77"}
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/order/staff/{order.pk}/access/", corrected)

    order.refresh_from_db()
    assert (order.access.host, order.access.notebook_token) == ("gpu-9.example.net", "nb-new-77")
    assert order.status == Status.ACTIVE
    event = order.events.last()
    assert event.note == "access details changed: host, notebook token"
    [mail] = mailoutbox
    assert mail.subject == f"Your order {order.reference}: your access details changed"
    assert "host, notebook token" in mail.body
    for secret in ("nb-new-77", "gpu-9", NOTEBOOK_TOKEN):
        assert secret not in mail.body

    # the same details again: nothing recorded, nothing sent
    with django_capture_on_commit_callbacks(execute=True):
        page = client.post(f"/order/staff/{order.pk}/access/", corrected, follow=True)
    assert "Nothing changed: those are the access details already" in page.content.decode()
    assert order.events.last().pk == event.pk
    assert len(mailoutbox) == 1


def test_the_access_of_a_finished_rental_cannot_be_corrected(make_order):
    order = svc.order_complete(order=_active(make_order))
    details = access.AccessDetails(host="gpu-9.example.net", port=22, username="ada")
    with pytest.raises(TransitionRefused, match="while the rental is active"):
        access.access_correct(order=order, actor="staff:t", details=details)
    assert order.access.host == "gpu-7.example.net"


# --- the tracking page -------------------------------------------------------------------


def test_the_tracking_page_shows_how_to_connect_only_once_active(client, make_order):
    order = _provisioning(make_order, export_folders=["results/run1"])
    RentalAccess.objects.create(order=order, host="gpu-7.example.net", port=2222, username="ada")
    url = f"/order/t/{order.tracking_token}/"

    waiting = client.get(url).content.decode()
    assert "gpu-7.example.net" not in waiting and 'id="ssh-command"' not in waiting
    assert ED25519_FINGERPRINT in waiting  # what the machines are set up with, already

    RentalAccess.objects.all().delete()
    order = _active_from(order)
    page = client.get(url).content.decode()
    assert '<code id="ssh-command">ssh -p 2222 ada@gpu-7.example.net</code>' in page
    assert 'data-copy="ssh-command"' in page
    assert "portal/rental.js" in page
    # the token is in a closed <details>: shown when the customer opens it
    assert '<details id="notebook-token-reveal">' in page
    assert page.index("<summary>Show the notebook token</summary>") < page.index(NOTEBOOK_TOKEN)
    assert 'id="rental-remaining"' in page and "6 d 23 h left" in page

    # the polled state fragment never carries it
    fragment = client.get(url, headers={"HX-Request": "true", "HX-Target": "order-state"})
    assert fragment.status_code == 200 and 'id="order-state"' in fragment.content.decode()
    assert "gpu-7" not in fragment.content.decode()


def _active_from(order):
    details = access.AccessDetails(
        host="gpu-7.example.net",
        port=2222,
        username="ada",
        notebook_url="https://gpu-7.example.net:8888/lab",
        notebook_token=NOTEBOOK_TOKEN,
    )
    return access.access_provision(order=order, actor="staff:t", details=details)


def test_the_access_is_behind_the_token_only(client, make_order):
    order = _active(make_order)
    wrong = order.tracking_token[:-2] + ("aa" if not order.tracking_token.endswith("aa") else "bb")
    response = client.get(f"/order/t/{wrong}/")
    assert response.status_code == 404
    assert b"gpu-7" not in response.content and NOTEBOOK_TOKEN.encode() not in response.content
    assert "no-store" in client.get(f"/order/t/{order.tracking_token}/")["Cache-Control"]


def test_the_batch_list_comes_with_its_campaign_command_lines(client, make_order, make_campaign):
    sized, extra = make_campaign("texts"), make_campaign("more-texts")
    order = _active(
        make_order,
        campaign=sized,
        campaigns=[extra],
        export_folders=["my results/run 1"],
    )
    page = client.get(f"/order/t/{order.tracking_token}/").content.decode()
    run = (
        "python manage.py campaign run texts --wait &amp;&amp; "
        "python manage.py campaign run more-texts --wait"
    )
    assert f'<code id="campaign-run">{run}</code>' in page
    assert "python manage.py campaign status texts" in page
    # the folder is quoted for the shell
    assert "campaign export texts --to &#x27;my results/run 1/texts&#x27;" in page


def test_the_end_of_the_rental_is_counted_down_and_reminded_on_the_page(
    client, make_order, settings
):
    settings.ORDER_END_REMINDER_HOURS = 24
    order = _active(make_order, days=3)
    url = f"/order/t/{order.tracking_token}/"
    assert 'id="rental-reminder"' not in client.get(url).content.decode()

    Order.objects.filter(pk=order.pk).update(
        ends_at=timezone.now() + timedelta(hours=5, minutes=30)
    )
    page = client.get(url).content.decode()
    assert "collect your results now" in page
    assert "5 h 29 min left" in page or "5 h 30 min left" in page


def test_the_reminder_before_the_end_is_sent_once_and_says_collect_your_results(
    make_order, mailoutbox, django_capture_on_commit_callbacks, settings
):
    settings.ORDER_END_REMINDER_HOURS = 12
    order = _active(make_order, days=3)
    mailoutbox.clear()
    almost = order.ends_at - timedelta(hours=11)

    for minutes in (0, 5, 10):
        with django_capture_on_commit_callbacks(execute=True):
            svc.orders_rental_end_sweep(now=almost + timedelta(minutes=minutes))

    [reminder] = mailoutbox
    assert (
        reminder.subject
        == f"Your order {order.reference}: the rental ends soon, collect your results"
    )
    assert "Collect your results now" in reminder.body
    assert NOTEBOOK_TOKEN not in reminder.body
    # too early for it: a sweep a day before the 12 hours sends nothing
    other = _active(make_order, days=3)
    with django_capture_on_commit_callbacks(execute=True):
        svc.orders_rental_end_sweep(now=other.ends_at - timedelta(hours=36))
    assert len(mailoutbox) == 1


# --- the staff order page -----------------------------------------------------------------


def _done_profile(campaign):
    from campaigns.models import Estimate, Profile

    profile = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.DONE,
        sample=[],
        device="NVIDIA L40S",
        runtime={"torch": "2.13.0"},
        memory_budget=40 << 30,
        steps=[],
        chosen_batch_size=64,
        chosen_peak_reserved=9 << 30,
    )
    Estimate.objects.create(
        profile=profile,
        version=campaign.current_version,
        device="NVIDIA L40S",
        units=39,
        batch_size=64,
        hours_measured_device=3.25,
        hours_naive=3.0,
        peak_memory=9 << 30,
        memory_tier_gb=24,
        output_bytes=1000,
        gpu_name="L40S",
        quantity=1,
        duration_days=7,
    )
    return profile


def test_the_staff_page_shows_the_batch_list_with_profile_and_estimate(
    client, staff, make_order, make_campaign
):
    sized, extra = make_campaign("texts"), make_campaign("more-texts")
    profile = _done_profile(sized)
    order = _provisioning(
        make_order, campaign=sized, profile=profile, campaigns=[extra], ssh_public_keys=[RSA_2048]
    )
    client.force_login(staff)
    page = client.get(f"/order/staff/{order.pk}/").content.decode()

    assert 'id="linked-texts"' in page and 'id="linked-more-texts"' in page
    assert page.index('id="linked-texts"') < page.index('id="linked-more-texts"')
    sized_block = page[page.index('id="linked-texts"') : page.index('id="linked-more-texts"')]
    # order staff read the campaign's figures here, but its pages are the
    # customer's: no link to them (a 404 for this account)
    assert f"profile {profile.pk} on NVIDIA L40S" in sized_block
    assert "/campaigns/texts/" not in page
    assert "batch size 64" in sized_block and "9.0\xa0GB" in sized_block
    assert "39 units in 3.25 h on NVIDIA L40S; plan 1 × L40S for 7 days" in sized_block
    assert "39: 0 succeeded, 39 pending" in sized_block
    assert "no profile has been run for this campaign" in page  # more-texts
    # the keys to install, whole, and their fingerprints
    assert RSA_2048 in page and RSA_2048_FINGERPRINT in page and "(2048 bits)" in page


def test_a_staff_account_that_may_only_look_gets_no_access_form(client, make_order):
    from django.contrib.auth.models import Permission

    from tests.conftest import UserFactory

    viewer = UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_order"))
    order = _provisioning(make_order)
    client.force_login(viewer)
    page = client.get(f"/order/staff/{order.pk}/").content.decode()
    assert 'id="access-form"' not in page
    assert client.post(f"/order/staff/{order.pk}/access/", GOOD_ACCESS).status_code == 403


def test_the_dossier_lists_what_the_machines_are_set_up_with_never_how_to_reach_them(
    make_order, make_campaign
):
    import io
    import json
    import zipfile

    from portal.dossier import dossier_bytes

    sized = make_campaign("texts")
    order = _active(
        make_order, campaign=sized, ssh_public_keys=[ED25519], export_folders=["results/run1"]
    )
    zf = zipfile.ZipFile(io.BytesIO(dossier_bytes(order=order)))
    doc = json.loads(zf.read("order.json"))
    text = b"".join(zf.read(name) for name in zf.namelist())
    assert doc["access"] == {
        "ssh_keys": [
            {"type": "ssh-ed25519", "fingerprint": ED25519_FINGERPRINT, "comment": "ada@laptop"}
        ],
        "export_folders": ["results/run1"],
        "batch_list": ["texts"],
    }
    for secret in (b"gpu-7", NOTEBOOK_TOKEN.encode(), order.tracking_token.encode()):
        assert secret not in text


def test_a_superuser_on_the_staff_page_gets_links_to_the_campaign_pages(
    client, make_order, make_campaign
):
    sized = make_campaign("texts")
    profile = _done_profile(sized)
    order = _provisioning(make_order, campaign=sized, profile=profile, ssh_public_keys=[RSA_2048])
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    page = client.get(f"/order/staff/{order.pk}/").content.decode()
    assert '<a href="/campaigns/texts/">texts</a>' in page
    assert f'<a href="/campaigns/texts/profile/">profile {profile.pk}</a> on' in page
