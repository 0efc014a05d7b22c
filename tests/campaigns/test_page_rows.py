"""The rows the campaign list and the review queue render in Python
(campaigns/templatetags/campaign_extras.py) are the markup their template loops
wrote, escaping included."""

from __future__ import annotations

from datetime import timedelta

from django.template import engines
from django.utils import timezone

from campaigns import selectors
from campaigns.models import Campaign, Checkpoint, Unit
from campaigns.review import queue as review
from campaigns.templatetags.campaign_extras import campaign_rows, options

# The campaign list's loop as the template had it.
LIST_LOOP = """{% load humanize campaign_extras %}
  {% for campaign, counts, state in rows %}
    <tr>
      <td><a href="{% url 'campaign_detail' campaign.name %}">{{ campaign.name }}</a></td>
      <td>{{ campaign.project.name }}</td>
      <td>{{ campaign.processor }}</td>
      <td class="run-state" data-state="{{ state.key }}" title="{{ state.detail }}">{% if state.checkpoint_id %}<a href="{% url 'checkpoint_detail' state.checkpoint_id %}">{{ state.label }}</a>{% else %}{{ state.label }}{% endif %}</td>
      <td><progress max="{{ counts.total }}" value="{{ counts.done }}"></progress> {{ counts.percent }}%</td>
      <td>{{ counts.succeeded|intcomma }}</td>
      <td>{{ counts.failed|intcomma }}</td>
      <td>{{ counts.pending|add:counts.queued|add:counts.running|intcomma }}</td>
      {% with v=verification|get_item:campaign.pk %}<td data-verification="{{ v.status }}">{{ v.status }}{% if v.by %}<br><small class="meta" data-verified-by>by {{ v.by }}{% if v.at %}, {{ v.at|date:"Y-m-d H:i" }}{% endif %}</small>{% elif v.checkpoint %}<br><small class="meta">since {{ v.checkpoint.created_at|date:"Y-m-d H:i" }}</small>{% endif %}</td>{% endwith %}
    </tr>
  {% endfor %}"""  # noqa: E501

OPTIONS_LOOP = """{% for name in campaigns %}<option value="{{ name }}"{% if name == selected %} selected{% endif %}>{{ name }}</option>{% endfor %}"""  # noqa: E501


def _list_rows(user):
    """(rows, verification) as the campaign list view builds them."""
    listed = selectors.campaign_list_for_user(user=user)
    counts = selectors.counts_by_campaign(campaign_ids=[c.pk for c, _ in listed])
    rows = [
        (c, counts[c.pk], selectors.run_state(campaign=c, counts=counts[c.pk], checkpoint=ck))
        for c, ck in listed
    ]
    return rows, {c.pk: review.verification_of(ck) for c, ck in listed}


def test_the_campaign_list_rows_are_the_markup_of_the_template_loop(make_campaign, owner):
    plain = make_campaign("texts")
    waiting, passed, failed = (make_campaign(n) for n in ("waiting", "passed", "failed"))
    Unit.objects.filter(campaign=plain).update(state="succeeded")
    Unit.objects.filter(campaign=plain, uid__startswith="news/").update(
        state="failed", error_class="timeout"
    )
    Campaign.objects.filter(pk=waiting.pk).update(paused_at=timezone.now())
    Checkpoint.objects.create(campaign=waiting, version=waiting.current_version, after_units=3)
    Checkpoint.objects.create(
        campaign=passed,
        version=passed.current_version,
        after_units=3,
        state=Checkpoint.State.PASSED,
        decided_by=owner,
        decided_at=timezone.now() - timedelta(days=2),
    )
    Checkpoint.objects.create(
        campaign=failed,
        version=failed.current_version,
        after_units=3,
        state=Checkpoint.State.FAILED,
        reason='a "repeating" <defect> & more',
    )
    rows, verification = _list_rows(owner)
    # Counts in the millions, grouped as |intcomma groups them.
    rows[0][1].succeeded, rows[0][1].pending = 1_234_567, 12_345
    assert {state.key for _, _, state in rows} >= {"checkpoint", "checkpoint_failed"}

    expected = (
        engines["django"]
        .from_string(LIST_LOOP)
        .render({"rows": rows, "verification": verification})
    )
    # The loop starts after the {% load %} line's newline and the tag's indent.
    assert "\n  " + str(campaign_rows(rows, verification)) == expected


def test_the_options_are_the_markup_of_the_template_loop():
    names = ["a&b", 'say "hi"', "<x>", "plain"]
    for selected in ("", "plain", "<x>"):
        expected = (
            engines["django"]
            .from_string(OPTIONS_LOOP)
            .render({"campaigns": names, "selected": selected})
        )
        assert str(options(names, selected)) == expected
