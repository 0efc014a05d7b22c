from __future__ import annotations

import django_tables2 as tables

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
