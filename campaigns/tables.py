from __future__ import annotations

import django_tables2 as tables
from django.urls import reverse
from django.utils.html import format_html

from .models import Unit


class UnitTable(tables.Table):
    uid = tables.Column(verbose_name="Unit id")
    state = tables.Column()
    error_class = tables.Column(verbose_name="Error")
    error_message = tables.Column(verbose_name="Reason")
    output_path = tables.Column(verbose_name="Output")

    class Meta:
        model = Unit
        fields = ["uid", "state", "error_class", "error_message", "output_path", "updated_at"]
        orderable = False
        attrs = {"class": "units", "id": "units"}
        empty_text = "No units in this state."

    def __init__(self, *args, campaign_name: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.campaign_name = campaign_name

    def render_uid(self, value, record):
        # The campaign is known: no query per row to build the link.
        url = reverse("unit_detail", args=[self.campaign_name, record.pk])
        return format_html('<a href="{}">{}</a>', url, value)
