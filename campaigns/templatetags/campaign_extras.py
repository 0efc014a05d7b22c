from django import template
from django.template.defaultfilters import filesizeformat
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

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


_UNIT_ROW = (
    '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>'
)


@register.simple_tag
def unit_rows(rows):
    """The unit table's rows, escaped, in one call: cheaper than the template's
    own loop over 50 rows of seven cells, on a page polled while a run goes
    (bench/RESULTS.md, "Pages at scale — `bench/pages_scale.py`")."""
    return format_html_join(
        "\n",
        _UNIT_ROW,
        (
            (url, uid, state, error_class or "—", message or "—", output or "—", updated)
            for url, uid, state, error_class, message, output, updated in rows
        ),
    )


_REVIEW_ROW = (
    '<tr id="row-{}" data-state="{}"{}>\n'
    '  <td><a href="{}{}" hx-get="{}{}" hx-target="#review-item" hx-swap="outerHTML"'
    ' hx-push-url="true">{}</a></td>\n'
    "  <td>{}</td><td>{}</td><td>{}</td></tr>"
)


@register.simple_tag
def review_rows(rows, item_prefix, current=None):
    """The review queue's rows (pk, state, reason, campaign name, unit id
    tuples), as its queue-row partial writes one, in one call: the template's
    loop took a third of the page for 100 rows (bench/RESULTS.md, "Pages at
    scale")."""
    current_pk = current.pk if current is not None else None
    return format_html_join(
        "",
        _REVIEW_ROW,
        (
            (
                pk,
                state,
                mark_safe(' aria-current="true"') if pk == current_pk else "",  # noqa: S308
                item_prefix,
                pk,
                item_prefix,
                pk,
                uid,
                campaign,
                reason,
                state,
            )
            for pk, state, reason, campaign, uid in rows
        ),
    )


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
