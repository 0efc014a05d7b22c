"""The staff group: exactly the permissions the documented staff tasks need.

docs/ordering.md, "For staff", lists the tasks: verify payments and move orders
on (the verification pages), record exchange rates, and keep the payment
address pool (the admin). Being `is_staff` lets an account log into the admin
and open the verification pages; what it may see and do there comes from these
permissions. It opens no customer's corpus: the campaign pages and the setup
page's folders follow project membership, and only a superuser sees every
project (campaigns.models.sees_every_project). The catalog (cards, prices,
stock) and the user accounts stay with the owner's superuser account.
"""

from __future__ import annotations

STAFF_GROUP = "Order staff"

# "app_label.codename" of each permission, with the task it serves.
STAFF_PERMISSIONS = (
    # Verification: the queue and an order's page (view), its actions (change):
    # confirm, mark partially paid, reject, provisioning. The admin shows orders
    # read-only whatever the permission (portal/admin.py).
    "portal.view_order",
    "portal.change_order",
    "portal.view_webhookdelivery",
    # Exchange rates: a rate is added, never edited (its stamp decides whether it quotes).
    "portal.view_exchangerate",
    "portal.add_exchangerate",
    # The payment address pool: load, correct and delete free addresses (an
    # assigned one is read-only and kept: portal/admin.py).
    "portal.view_paymentaddress",
    "portal.add_paymentaddress",
    "portal.change_paymentaddress",
    "portal.delete_paymentaddress",
    # The currencies the rates and addresses are for (a choice in their forms).
    "portal.view_cryptocurrency",
)

# The verification pages ask for these (portal/staff_views.py).
VERIFY_VIEW = "portal.view_order"
VERIFY_ACT = "portal.change_order"


def staff_group_sync(**kwargs):
    """Create the group or set its permissions back to the list (after every migrate).

    A permission added to the group by hand is taken away again here: a
    deployment that wants more makes a group of its own.
    """
    from django.contrib.auth.models import Group, Permission

    group, _ = Group.objects.get_or_create(name=STAFF_GROUP)
    wanted = []
    for dotted in STAFF_PERMISSIONS:
        app_label, codename = dotted.split(".")
        permission = Permission.objects.filter(
            content_type__app_label=app_label, codename=codename
        ).first()
        if permission is not None:  # created by auth's own post_migrate, just before
            wanted.append(permission)
    group.permissions.set(wanted)
    return group
