"""Instances read from plain SQL rows (campaigns/db/sql_rows.py) are the
ORM's: the same field values, the same deferred fields, saved and refreshed
as the ORM's are, though they are built without Model.__init__."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, models
from django.db.models.signals import post_init

from campaigns.db import sql_rows
from campaigns.models import Campaign, ParameterVersion, Project, Unit


def _read(model, pk, names=()):
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {sql_rows.columns(model, 't', names)} "  # noqa: S608 (column names only)
            f"FROM {model._meta.db_table} t WHERE t.id = %s",
            [pk],
        )
        row = cursor.fetchone()
    return sql_rows.instance(model, iter(row), names)


def _fields(instance) -> dict:
    return {k: v for k, v in instance.__dict__.items() if k != "_state"}


@pytest.fixture
def campaign(make_campaign):
    return make_campaign("texts")


@pytest.mark.parametrize(
    ("model", "names"),
    [
        (Campaign, ()),
        (Campaign, ("id", "project", "name", "processor", "current_version", "paused_at")),
        (Project, ("id", "name")),
        (ParameterVersion, ()),
        (Unit, ()),
        (Unit, ("id", "uid", "state", "updated_at")),
        (get_user_model(), ("id", "username")),
    ],
)
def test_an_instance_read_from_a_row_is_the_orms(campaign, owner, model, names):
    pk = {
        Campaign: campaign.pk,
        Project: campaign.project_id,
        ParameterVersion: campaign.current_version_id,
        Unit: Unit.objects.filter(campaign=campaign).order_by("pk").values_list("pk")[0][0],
        get_user_model(): owner.pk,
    }[model]
    orm = model.objects.only(*names).get(pk=pk) if names else model.objects.get(pk=pk)
    found = _read(model, pk, names)
    assert type(found) is model
    assert _fields(found) == _fields(orm)
    assert found.get_deferred_fields() == orm.get_deferred_fields()
    assert (found._state.adding, found._state.db) == (False, "default")
    assert found == orm


def test_a_field_not_read_loads_on_use_and_the_instance_saves(campaign):
    found = _read(Campaign, campaign.pk, ("id", "name"))
    assert "processor" in found.get_deferred_fields()
    assert found.processor == campaign.processor  # loaded from the database now
    found.name = "renamed"
    found.save(update_fields=["name"])
    assert Campaign.objects.get(pk=campaign.pk).name == "renamed"
    found.refresh_from_db()
    assert found.project.pk == campaign.project_id  # relations follow as the ORM's do


def test_a_model_with_an_init_receiver_is_refused(campaign):
    class Watched(models.Model):
        class Meta:
            app_label = "campaigns"
            managed = False

    def receiver(**kwargs):
        pass

    post_init.connect(receiver, sender=Watched)
    try:
        with pytest.raises(TypeError, match="init signal receivers"):
            sql_rows.reader(Watched)
    finally:
        post_init.disconnect(receiver, sender=Watched)


def test_a_related_row_attached_is_read_without_a_query_as_select_related_leaves_it(
    campaign, django_assert_num_queries
):
    found = _read(Campaign, campaign.pk, ("id", "name"))
    project = _read(Project, campaign.project_id)
    version = _read(ParameterVersion, campaign.current_version_id)
    sql_rows.attach(found, "project", project)
    sql_rows.attach(found, "current_version", version)
    orm = Campaign.objects.select_related("project", "current_version").get(pk=campaign.pk)
    with django_assert_num_queries(0):
        assert found.project is project and found.current_version is version
        assert (found.project_id, found.current_version_id) == (
            orm.project_id,
            orm.current_version_id,
        )
        assert _fields(found.project) == _fields(orm.project)
    sql_rows.attach(found, "current_version", None)
    with django_assert_num_queries(0):
        assert found.current_version is None and found.current_version_id is None
