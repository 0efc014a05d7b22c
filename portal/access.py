"""A rental's access, in and out.

In: what the customer gives with the order (SSH public keys, checked by
portal/ssh_keys.py; the folders results are exported to; the campaigns of the
batch list). Out: what staff record when they provision the machines (host,
port, user, optionally a notebook URL and its token), and what the tracking
page shows from both: the SSH command, the `campaign` command lines of the
batch list, the time left.

The secrets (the notebook token, and the host and user together with the
page's own token) are shown on the tracking page only, behind the order's
token. E-mails say that something is ready or changed and link to the page;
they never carry the values (an e-mail may be forwarded or kept anywhere).
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import shlex
import unicodedata
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from campaigns.models import Campaign
from campaigns.selectors import Counts, counts_by_campaign
from portal import emails, order_services
from portal.dossier import order_estimate
from portal.models import Order, OrderEvent, RentalAccess
from portal.order_states import Status, TransitionRefused
from portal.ssh_keys import KeyRefused, PublicKey, parse_key

# --- what the customer gives -------------------------------------------------

EXPORT_FOLDERS_MAX = 10
EXPORT_FOLDER_MAX = 200
# Where results go when the customer named no folder.
DEFAULT_EXPORT_FOLDER = "results"
# The batch list of one order: enough for any rental, a bounded page and e-mail.
BATCH_CAMPAIGNS_MAX = 20


class FolderRefused(ValueError):
    """An export folder the machines will not be set up with; the message says why."""


def export_folder(text: str) -> str:
    """`text` as a clean relative folder (`results/run 1`), or FolderRefused.

    Relative to the rental user's home folder, so never absolute, never
    climbing out with `..`, never starting with `~` or `-` (a shell or a
    command line would read those), one line of visible characters.
    """
    value = text.strip()
    if not value:
        raise FolderRefused("is empty.")
    if len(value) > EXPORT_FOLDER_MAX:
        raise FolderRefused(f"is longer than {EXPORT_FOLDER_MAX} characters.")
    if any(unicodedata.category(ch)[0] == "C" for ch in value):
        raise FolderRefused("contains control characters (a line break, a tab).")
    if "\\" in value:
        raise FolderRefused('uses "\\"; separate folders with "/".')
    if value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", value):
        raise FolderRefused(
            "must be relative to your home folder on the machine, like results/run1."
        )
    parts = [part for part in value.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise FolderRefused('may not contain "..": it must stay inside your home folder.')
    if not parts:
        raise FolderRefused("names no folder.")
    if any(part.startswith("-") for part in parts):
        raise FolderRefused(
            'has a folder name starting with "-", which commands read as an option.'
        )
    return posixpath.join(*parts)


def parse_export_folders(text: str) -> tuple[list[str], list[str]]:
    """The folders of a list (one a line, blank lines skipped, each kept once)
    and the reasons lines were refused, each naming its line."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if len(lines) > EXPORT_FOLDERS_MAX:
        return [], [f"{len(lines)} folders given; an order takes at most {EXPORT_FOLDERS_MAX}."]
    folders: list[str] = []
    errors: list[str] = []
    for n, line in lines:
        try:
            folder = export_folder(line)
        except FolderRefused as exc:
            errors.append(f"Line {n} {exc}")
            continue
        if folder not in folders:
            folders.append(folder)
    return folders, errors


# --- staff: provision and correct ---------------------------------------------------


@dataclass(frozen=True)
class AccessDetails:
    host: str
    port: int
    username: str
    notebook_url: str = ""
    notebook_token: str = ""


# The fields a correction compares, with the words the customer reads.
ACCESS_LABELS = (
    ("host", "host"),
    ("port", "port"),
    ("username", "user"),
    ("notebook_url", "notebook address"),
    ("notebook_token", "notebook token"),
)


def access_provision(
    *,
    order: Order,
    actor: str,
    details: AccessDetails,
    note: str = "",
    now: datetime | None = None,
) -> Order:
    """Record how the customer connects and start the rental (PROVISIONING → ACTIVE).

    One transaction: the access row and the move commit together, so an
    active rental always has its access, and a refused move (another state,
    cards gone) records none. The e-mail of the move says the rental is ready
    and links to the tracking page; the event's note names no value.
    """
    recorded = "access details recorded: host, port, user" + (
        ", notebook" if details.notebook_url else ""
    )
    with transaction.atomic():
        locked = Order.objects.select_for_update().get(pk=order.pk)
        if locked.status != Status.PROVISIONING:
            raise TransitionRefused(locked.status, Status.ACTIVE)
        RentalAccess.objects.update_or_create(order=locked, defaults=asdict(details))
        order = order_services.order_mark_provisioned(
            order=locked,
            actor=actor,
            note=f"{recorded}; {note}" if note else recorded,
            now=now,
        )
    return order


def access_correct(
    *, order: Order, actor: str, details: AccessDetails, note: str = ""
) -> list[str]:
    """Change an active rental's access; the names of what changed ([] for nothing).

    The change goes on the customer's timeline and into an e-mail that names
    the fields changed, never their values.
    """
    with transaction.atomic():
        locked = Order.objects.select_for_update().get(pk=order.pk)
        if locked.status != Status.ACTIVE:
            raise TransitionRefused(
                locked.status,
                Status.ACTIVE,
                f"access can be corrected while the rental is active; this order is "
                f"{locked.get_status_display().lower()}",
            )
        access = RentalAccess.objects.filter(order=locked).first() or RentalAccess(order=locked)
        changed = [
            label
            for name, label in ACCESS_LABELS
            if getattr(access, name) != getattr(details, name)
        ]
        if not changed:
            return []
        for name, value in asdict(details).items():
            setattr(access, name, value)
        access.save()
        text = "access details changed: " + ", ".join(changed)
        OrderEvent.objects.create(
            order=locked,
            from_status=locked.status,
            to_status=locked.status,
            actor=actor,
            note=f"{text}; {note}" if note else text,
        )
        transaction.on_commit(
            lambda: emails.send_order_email(order_id=locked.pk, kind="access_changed")
        )
    return changed


# --- what the tracking page shows ------------------------------------------------


@dataclass(frozen=True)
class Connection:
    host: str
    port: int
    username: str
    ssh_command: str
    notebook_url: str
    notebook_token: str


@dataclass(frozen=True)
class RentalView:
    """What the tracking page's access block shows."""

    keys: list[PublicKey]
    export_folders: list[str]
    campaigns: list[str]
    # Where the commands export to: the first folder given, else the default.
    export_to: str = DEFAULT_EXPORT_FOLDER
    # The rest only while the rental is active with its access recorded.
    connection: Connection | None = None
    run_command: str = ""
    status_command: str = ""
    export_command: str = ""
    ends_at: datetime | None = None
    remaining: str = ""
    ending_soon: bool = False
    reminder_hours: int = 0
    problems: list[str] = field(default_factory=list)


def stored_keys(order: Order) -> tuple[list[PublicKey], list[str]]:
    """The order's keys, read again from their stored lines (for the fingerprints)."""
    keys, problems = [], []
    for n, line in enumerate(order.ssh_public_keys or [], 1):
        try:
            keys.append(parse_key(line))
        except KeyRefused as exc:  # a line written around the form: say so, show the rest
            problems.append(f"Key {n} {exc}")
    return keys, problems


def ssh_command(*, host: str, port: int, username: str) -> str:
    return f"ssh -p {port} {username}@{host}"


def campaign_commands(*, campaigns: list[str], export_folder: str) -> dict[str, str]:
    """One command line each to run, follow and export the batch list, on the
    machine (`python manage.py campaign …`, docs/ordering.md). Names are slugs;
    the folder is quoted for the shell all the same."""
    manage = "python manage.py campaign"
    return {
        "run": " && ".join(f"{manage} run {name} --wait" for name in campaigns),
        "status": " && ".join(f"{manage} status {name}" for name in campaigns),
        "export": " && ".join(
            f"{manage} export {name} --to {shlex.quote(posixpath.join(export_folder, name))}"
            for name in campaigns
        ),
    }


def remaining_text(*, ends_at: datetime, now: datetime) -> str:
    """The time left, as the page's countdown writes it (portal/static/portal/rental.js)."""
    seconds = int((ends_at - now).total_seconds())
    if seconds <= 0:
        return "ended"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h left"
    if hours:
        return f"{hours} h {minutes} min left"
    return f"{minutes} min left" if minutes else "less than a minute left"


def rental_view(*, order: Order, now: datetime | None = None) -> RentalView:
    now = now or timezone.now()
    keys, problems = stored_keys(order)
    campaigns = order.batch_list()
    folders = list(order.export_folders or [])
    export_to = folders[0] if folders else DEFAULT_EXPORT_FOLDER
    view = RentalView(
        keys=keys,
        export_folders=folders,
        campaigns=campaigns,
        export_to=export_to,
        problems=problems,
    )
    access = RentalAccess.objects.filter(order=order).first()
    if order.status != Status.ACTIVE or access is None:
        return view
    connection = Connection(
        host=access.host,
        port=access.port,
        username=access.username,
        ssh_command=ssh_command(host=access.host, port=access.port, username=access.username),
        notebook_url=access.notebook_url,
        notebook_token=access.notebook_token,
    )
    commands = campaign_commands(campaigns=campaigns, export_folder=export_to)
    hours = settings.ORDER_END_REMINDER_HOURS
    ends_at = order.ends_at
    return replace(
        view,
        connection=connection,
        run_command=commands["run"],
        status_command=commands["status"],
        export_command=commands["export"],
        ends_at=ends_at,
        remaining=remaining_text(ends_at=ends_at, now=now) if ends_at else "",
        ending_soon=ends_at is not None and ends_at - now <= timedelta(hours=hours),
        reminder_hours=hours,
    )


# --- what staff see ----------------------------------------------------------------


@dataclass(frozen=True)
class LinkedCampaign:
    campaign: Campaign
    counts: Counts
    # order_estimate's answer: the profile the rental was sized on and its estimate.
    estimate: dict[str, Any]


def linked_campaigns(*, order: Order) -> list[LinkedCampaign]:
    """The batch list's campaigns, the one the order was sized on first, each
    with its counts and the profile and estimate the rental was sized on."""
    chosen = list(order.campaigns.select_related("current_version"))
    if order.campaign is not None and all(c.pk != order.campaign_id for c in chosen):
        chosen.append(order.campaign)  # an order made before batch lists
    chosen.sort(key=lambda c: (c.pk != order.campaign_id, c.name))
    counts = counts_by_campaign(campaign_ids=[c.pk for c in chosen])
    return [
        LinkedCampaign(
            campaign=c, counts=counts[c.pk], estimate=order_estimate(order=order, campaign=c)
        )
        for c in chosen
    ]


# --- what staff enter ----------------------------------------------------------------

# A DNS name (RFC 1123 labels) or an IP address; what `ssh` takes as a host.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
# A POSIX user name as useradd takes it.
USERNAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def valid_host(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        pass
    else:
        return True
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and all(_LABEL.match(label) for label in name.split("."))
