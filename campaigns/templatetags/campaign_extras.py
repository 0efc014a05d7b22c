import functools
from html import escape

from django import template
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.template.defaultfilters import date as date_filter
from django.template.defaultfilters import filesizeformat
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe
from django.utils.timezone import localtime

from campaigns.storage.vector_shards import split_member

register = template.Library()


@register.filter
def get_item(mapping, key):
    """mapping[key] in a template, for JSON fields keyed by verdict."""
    return (mapping or {}).get(key, [])


@register.filter
def size_or_dash(value):
    """A byte count as filesizeformat writes it; "—" where none was measured
    (filesizeformat would say "0 bytes")."""
    return "—" if value is None else filesizeformat(value)


@functools.lru_cache(maxsize=4096)
def _reversed(urlconf, prefix: str, viewname: str, args: tuple) -> str:
    # The script prefix is read by reverse() itself; it is in the key so that
    # a site mounted under another prefix gets its own entries.
    return reverse(viewname, urlconf=urlconf, args=args)


@receiver(setting_changed)
def _urls_changed(*, setting: str, **kwargs) -> None:
    # As Django's own resolver caches (a test that swaps the URLconf).
    if setting == "ROOT_URLCONF":
        _reversed.cache_clear()


@register.simple_tag
def url_of(viewname, *args):
    """{% url %} remembered for the process: the campaign page names 37 URLs
    of a few views, and reversing each costs more than the rest of its line
    (bench/RESULTS.md, "The campaign page's rows and URLs (2026-12-04)"). A
    URL depends only on the URLconf, the script prefix and its arguments, all
    in the key; the cache keeps the 4,096 last used."""
    return _reversed(get_urlconf(), get_script_prefix(), viewname, args)


@register.simple_tag
def unit_rows(rows):
    """The unit table's rows, escaped, in one call: cheaper than the template's
    own loop over 50 rows of seven cells, and than format_html_join's lazy
    escaping of each cell, on a page polled while a run goes (bench/RESULTS.md,
    "The campaign page's rows and URLs (2026-12-04)"). Each text is escaped once."""
    html = []
    for url, uid, state, error_class, message, output, updated in rows:
        html.append(
            f'<tr><td><a href="{escape(url)}">{escape(uid)}</a></td><td>{escape(state)}</td>'
            f"<td>{escape(error_class or '—')}</td><td>{escape(message or '—')}</td>"
            f"<td>{escape(output or '—')}</td><td>{escape(updated)}</td></tr>"
        )
    return mark_safe("\n".join(html))  # noqa: S308 (every value escaped above)


@register.simple_tag
def review_rows(rows, item_prefix, current=None):
    """The review queue's rows (pk, state, reason, campaign name, unit id
    tuples), as its queue-row partial writes one, in one call: the template's
    loop took a third of the page for 100 rows, format_html_join still 9 ms
    on a slow machine, this 2.5 (bench/RESULTS.md, "Pages at scale"). Each
    text is escaped once; ids are ints."""
    prefix = conditional_escape(item_prefix)
    current_pk = current.pk if current is not None else None
    html = []
    for pk, state, reason, campaign, uid in rows:
        pk = int(pk)
        state = escape(state)
        here = ' aria-current="true"' if pk == current_pk else ""
        html.append(
            f'<tr id="row-{pk}" data-state="{state}"{here}>\n'
            f'  <td><a href="{prefix}{pk}" hx-get="{prefix}{pk}" hx-target="#review-item"'
            f' hx-swap="outerHTML" hx-push-url="true">{escape(uid)}</a></td>\n'
            f"  <td>{escape(campaign)}</td><td>{escape(reason)}</td><td>{state}</td></tr>"
        )
    return mark_safe("".join(html))  # noqa: S308 (every value escaped above)


@register.simple_tag
def options(values, selected):
    """<option>s of a <select>, the selected one marked: one call for a
    hundred campaigns where the template's loop renders each."""
    html = [
        f'<option value="{escape(value)}"{" selected" if value == selected else ""}>'
        f"{escape(value)}</option>"
        for value in values
    ]
    return mark_safe("".join(html))  # noqa: S308 (every value escaped above)


_CAMPAIGN_ROW = (
    "\n    <tr>\n"
    '      <td><a href="{url}">{name}</a></td>\n'
    "      <td>{project}</td>\n"
    "      <td>{processor}</td>\n"
    '      <td class="run-state" data-state="{key}" title="{detail}">{label}</td>\n'
    '      <td><progress max="{total}" value="{done}"></progress> {percent}%</td>\n'
    "      <td>{succeeded}</td>\n"
    "      <td>{failed}</td>\n"
    "      <td>{remaining}{eta}</td>\n"
    '      <td data-verification="{status}">{status}{meta}</td>\n'
    "    </tr>\n  "
)


def _minute(moment) -> str:
    """An aware time as the template's |date:"Y-m-d H:i" writes it (in the current zone)."""
    return date_filter(localtime(moment), "Y-m-d H:i")


@register.simple_tag
def campaign_rows(rows, verification, etas=None):
    """The campaign list's rows ((campaign, counts, run state) with the
    verification by campaign id, and the ETA text of the active ones by
    campaign id), as the template's loop wrote them, in one call: a hundred
    campaigns' rows took most of the list's time (bench/RESULTS.md, "Pages at
    scale"). Each text is escaped once; counts are grouped by commas,
    as |intcomma groups them in the site's language (en-us)."""
    detail_url = reverse("campaign_detail", args=["-name-"])
    html = []
    for campaign, counts, state in rows:
        name = escape(campaign.name)
        label = escape(state.label)
        if state.checkpoint_id:
            url = reverse("checkpoint_detail", args=[state.checkpoint_id])
            label = f'<a href="{escape(url)}">{label}</a>'
        v = verification[campaign.pk]
        meta = ""
        if v.by:
            at = f", {_minute(v.at)}" if v.at else ""
            meta = f'<br><small class="meta" data-verified-by>by {escape(v.by)}{at}</small>'
        elif v.checkpoint:
            meta = f'<br><small class="meta">since {_minute(v.checkpoint.created_at)}</small>'
        html.append(
            _CAMPAIGN_ROW.format(
                url=escape(detail_url.replace("-name-", campaign.name)),
                name=name,
                project=escape(campaign.project.name),
                processor=escape(campaign.processor),
                key=escape(state.key),
                detail=escape(state.detail),
                label=label,
                total=counts.total,
                done=counts.done,
                percent=counts.percent,
                succeeded=f"{counts.succeeded:,}",
                failed=f"{counts.failed:,}",
                remaining=f"{counts.pending + counts.queued + counts.running:,}",
                eta=f'<br><small class="meta" data-eta>{escape(eta)}</small>'
                if (eta := (etas or {}).get(campaign.pk))
                else "",
                status=escape(v.status),
                meta=meta,
            )
        )
    return mark_safe("".join(html))  # noqa: S308 (every value escaped above)


@register.filter
def output_location(rel: str):
    """Where a unit's output is: its file, or its row of its batch's shard."""
    file_rel, row = split_member(rel)
    if row is None:
        return format_html("<code>{}</code>", file_rel)
    return format_html("row {} of its batch's shard <code>{}</code>", row, file_rel)


@register.filter
def duration(seconds):
    """Seconds as a person reads them: 42 s, 3 min 5 s, 2.4 h; "—" where none."""
    if seconds is None:
        return "—"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    return f"{seconds / 3600:.1f} h"


@register.filter
def percent(share):
    """A share (0..1) as a whole percentage; "—" where none (nothing decided)."""
    return "—" if share is None else f"{share:.0%}"
