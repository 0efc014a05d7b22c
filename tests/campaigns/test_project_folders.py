"""Per-customer corpora: a user makes campaigns only over the folders of their
own projects, checked again at every import and run; staff give and take the
folders (the admin, `campaign folders`). docs/operations.md, "Giving a project
its folders"."""

from __future__ import annotations

import json
import os
import random
import shutil
from io import StringIO
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from PIL import Image

from campaigns.intake import project_folders
from campaigns.intake.project_folders import FolderRefused
from campaigns.models import Batch, Campaign, ErrorClass, Project, ProjectFolder, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.specs.builtin import TEXT_EMBEDDING
from gpuworker.runner.batch import run_batch
from tests.conftest import DEMO_CORPUS, UserFactory

pytestmark = pytest.mark.django_db
NEW = reverse("campaign_new")
SECRET = "Beta's confidential memo: the merger closes on Friday."


@pytest.fixture
def shared(tmp_path, settings):
    """One server's corpora: acme's (owner's) and beta's (outsider's) side by
    side under one CORPUS_ROOTS entry, as on a shared deployment."""
    data = tmp_path / "data"
    acme, beta = data / "acme", data / "beta"
    shutil.copytree(DEMO_CORPUS, acme / "texts")
    (beta / "private").mkdir(parents=True)
    (beta / "private" / "memo.txt").write_text(SECRET)
    settings.CORPUS_ROOTS = [data]
    return data


@pytest.fixture
def customers(shared, owner, outsider, allow_folder):
    allow_folder(shared / "acme", project="acme", members=[owner])
    allow_folder(shared / "beta", project="beta", members=[outsider])
    return shared


def _form(folder, *, project="acme", action="create", **extra) -> dict:
    data = {
        "project": project,
        "name": "mine",
        "processor": "text-embedding",
        "folder": str(folder),
        "action": action,
    }
    data.update({f"param_{k}": v for k, v in TEXT_EMBEDDING.clean({}).items()})
    data.update(extra)
    return data


def _call(*args) -> str:
    out = StringIO()
    call_command("campaign", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


# --- the setup page -------------------------------------------------------------


def test_the_setup_page_offers_only_the_folders_of_the_users_projects(client, owner, customers):
    client.force_login(owner)
    html = client.get(NEW).content.decode()
    assert f'value="{customers / "acme"}"' in html
    assert f'value="{customers / "acme" / "texts" / "news"}"' in html
    assert "beta" not in html  # neither beta's folder nor its project


def test_another_customers_folder_is_refused_on_the_setup_page_and_nothing_is_read(
    client, owner, customers
):
    client.force_login(owner)
    theirs = customers / "beta" / "private"
    with mock.patch.object(start.celery_app, "send_task") as send:
        preview = client.post(NEW, _form(theirs, action="preview"))
        create = client.post(NEW, _form(theirs))
    for response in (preview, create):
        html = response.content.decode()
        assert response.status_code == 400
        assert "that folder is not one your projects may read" in html
        assert "memo.txt" not in html and "merger" not in html
    assert not Campaign.objects.exists() and not send.called


def test_another_customers_project_cannot_be_named_on_the_setup_page(client, owner, customers):
    client.force_login(owner)
    response = client.post(NEW, _form(customers / "beta" / "private", project="beta"))
    assert response.status_code == 400
    assert "that project is not one of yours" in response.content.decode()
    assert not Campaign.objects.exists()


def test_a_new_project_cannot_be_made_from_the_setup_page(client, owner, customers):
    client.force_login(owner)
    response = client.post(NEW, _form(customers / "acme" / "texts", project="brand-new"))
    assert response.status_code == 400
    assert not Project.objects.filter(name="brand-new").exists()
    assert not Campaign.objects.exists()


def test_one_projects_folder_is_refused_under_another_project_of_the_same_user(
    client, owner, customers, allow_folder, tmp_path
):
    (customers / "gamma").mkdir()
    allow_folder(customers / "gamma", project="gamma", members=[owner])
    client.force_login(owner)
    response = client.post(NEW, _form(customers / "acme" / "texts", project="gamma"))
    assert response.status_code == 400
    assert "is not inside a folder of project gamma" in response.content.decode()
    assert not Campaign.objects.exists()


def test_a_user_whose_projects_have_no_folder_is_told_whom_to_ask(client, outsider, shared):
    client.force_login(outsider)
    html = client.get(NEW).content.decode()
    assert "None of your projects has a folder to read yet" in html
    assert str(shared) not in html


def test_own_folder_still_creates_and_starts(client, owner, customers):
    client.force_login(owner)
    with mock.patch.object(start.celery_app, "send_task"):
        response = client.post(NEW, _form(customers / "acme" / "texts"))
    assert response.status_code == 302
    campaign = Campaign.objects.get(name="mine")
    assert campaign.project.name == "acme"
    assert campaign.input_root == str(customers / "acme" / "texts")


# --- the rule itself, for every entry point that takes a folder --------------------


def test_a_folder_whose_name_only_begins_like_a_project_folder_is_outside_it(
    owner, shared, allow_folder
):
    # given: acme has /data/a; /data/ab is someone else's
    (shared / "a").mkdir()
    (shared / "ab").mkdir()
    (shared / "ab" / "x.txt").write_text(SECRET)
    allow_folder(shared / "a", project="acme", members=[owner])
    acme = Project.objects.get(name="acme")

    # then: refused by the rule the page and the services share
    assert project_folders.is_inside(str(shared / "a" / "b"), str(shared / "a"))
    assert not project_folders.is_inside(str(shared / "ab"), str(shared / "a"))
    with pytest.raises(FolderRefused, match="is not inside a folder of project acme"):
        setup.campaign_create(
            name="prefix",
            processor="text-embedding",
            project=acme,
            input_folder=shared / "ab",
            user=owner,
        )
    assert not Campaign.objects.exists()


@pytest.mark.parametrize("way", ["symlink", "dotdot"])
def test_a_path_that_leads_out_of_the_project_folder_is_refused(client, owner, customers, way):
    acme = customers / "acme"
    if way == "symlink":
        os.symlink(customers / "beta" / "private", acme / "shortcut")
        asked = acme / "shortcut"
    else:
        asked = Path(f"{acme}/texts/../../beta/private")
    client.force_login(owner)

    # the page does not offer it, and refuses it posted
    assert str(asked) not in client.get(NEW).content.decode()
    assert client.post(NEW, _form(asked)).status_code == 400

    # nor does the service the page calls take it
    with pytest.raises(FolderRefused):
        setup.campaign_create(
            name="escape",
            processor="text-embedding",
            project=Project.objects.get(name="acme"),
            input_folder=asked,
            user=owner,
        )
    assert not Campaign.objects.exists()


def test_a_manifest_create_is_held_to_the_folder_too(owner, customers, tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,path\nmemo,memo.txt\n")
    with pytest.raises(FolderRefused):
        setup.campaign_create(
            name="by-manifest",
            processor="text-embedding",
            project=Project.objects.get(name="acme"),
            manifest=manifest,
            input_root=customers / "beta" / "private",
            user=owner,
        )
    assert not Unit.objects.exists()


def test_order_staff_are_offered_no_customers_folders_and_cannot_create_over_them(
    client, staff, customers
):
    # `is_staff` in the order-staff group verifies payments; it reads no corpus
    client.force_login(staff)
    html = client.get(NEW).content.decode()
    assert str(customers / "acme") not in html and str(customers / "beta") not in html
    for project in ("acme", "beta"):
        folder = customers / project
        assert client.post(NEW, _form(folder, project=project)).status_code == 400
    assert not Campaign.objects.exists()


def test_a_superuser_uses_any_projects_folders_but_each_under_its_own_project(client, customers):
    root = UserFactory(username="operator", is_staff=True, is_superuser=True)
    client.force_login(root)
    html = client.get(NEW).content.decode()
    assert str(customers / "acme") in html and str(customers / "beta") in html
    crossed = client.post(NEW, _form(customers / "beta" / "private", project="acme"))
    assert crossed.status_code == 400
    assert not Campaign.objects.exists()
    with mock.patch.object(start.celery_app, "send_task"):
        made = client.post(NEW, _form(customers / "beta" / "private", project="beta"))
    assert made.status_code == 302
    assert Campaign.objects.get(name="mine").project.name == "beta"


# --- again at import and run ----------------------------------------------------


def _noise(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    image = Image.frombytes("RGB", (32, 32), bytes(rng.randrange(256) for _ in range(32 * 32 * 3)))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")


@pytest.fixture
def swapped(client, owner, customers, output_root):
    """A campaign made on the setup page over acme/pics; afterwards acme/pics is
    replaced by a symlink to beta's pictures (same names, beta's content)."""
    for i in range(3):
        _noise(customers / "acme" / "pics" / f"p{i}.png", seed=i)
        _noise(customers / "beta" / "pics" / f"p{i}.png", seed=100 + i)
    client.force_login(owner)
    form = _form(
        customers / "acme" / "pics",
        name="pics",
        processor="image-transform",
        params_for="image-transform",
        checkpoint_after="0",
    )
    form = {k: v for k, v in form.items() if not k.startswith("param_")}
    form.update(param_operation="resize", param_width="16", param_height="16", param_format="png")
    with mock.patch.object(start.celery_app, "send_task"):
        assert client.post(NEW, form).status_code == 302
    campaign = Campaign.objects.get(name="pics")

    def swap() -> None:
        shutil.rmtree(customers / "acme" / "pics")
        os.symlink(customers / "beta" / "pics", customers / "acme" / "pics")

    return campaign, swap


def test_a_folder_swapped_for_a_symlink_after_creation_is_refused_at_import(swapped, customers):
    campaign, swap = swapped
    swap()
    with pytest.raises(FolderRefused) as refused:
        setup.campaign_import(campaign=campaign)
    message = refused.value.messages[0]
    assert f"now leads to {customers / 'beta' / 'pics'}" in message
    assert "outside the folders of project acme" in message
    with pytest.raises(CommandError, match="now leads to"):
        _call("import", "pics")


def test_a_folder_swapped_after_creation_is_refused_at_run_on_the_page_and_the_command_line(
    client, swapped
):
    campaign, swap = swapped
    Unit.objects.filter(campaign=campaign).update(state=UnitState.PENDING, batch=None)
    Batch.objects.filter(campaign=campaign).delete()
    swap()
    with mock.patch.object(start.celery_app, "send_task") as send:
        page = client.post(reverse("campaign_run", args=["pics"]), follow=True)
        with pytest.raises(CommandError, match="now leads to"):
            _call("run", "pics")
        resumed = client.post(reverse("campaign_resume", args=["pics"]), follow=True)
    assert "now leads to" in page.content.decode()
    assert "Nothing resumed: the campaign&#x27;s folder" in resumed.content.decode()
    assert not send.called and not Batch.objects.exists()


def test_batches_queued_before_the_swap_read_nothing_and_say_why(swapped, output_root):
    campaign, swap = swapped
    queued = list(Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED))
    assert queued
    swap()
    for batch in queued:
        run_batch(batch.pk)
    units = Unit.objects.filter(campaign=campaign)
    assert not units.filter(state=UnitState.SUCCEEDED).exists()
    assert set(units.values_list("error_class", flat=True)) == {ErrorClass.INPUT_UNREADABLE}
    assert "now leads to" in units.first().error_message
    assert not list(output_root.rglob("*.png"))


def test_a_unit_page_shows_no_input_from_a_swapped_folder(client, customers, owner, output_root):
    campaign, _ = setup.campaign_create(
        name="texts",
        processor="text-embedding",
        project=Project.objects.get(name="acme"),
        input_folder=customers / "acme" / "texts",
        user=owner,
    )
    (customers / "beta" / "private" / "short").mkdir()
    (customers / "beta" / "private" / "short" / "question.txt").write_text(SECRET)
    shutil.rmtree(customers / "acme" / "texts")
    os.symlink(customers / "beta" / "private", customers / "acme" / "texts")
    unit = campaign.units.get(uid="short/question.txt")
    client.force_login(owner)
    html = client.get(reverse("unit_detail", args=["texts", unit.pk])).content.decode()
    assert "merger" not in html
    assert "now leads to" in html


def test_a_folder_taken_from_the_project_stops_its_campaigns_imports(owner, customers):
    campaign, _ = setup.campaign_create(
        name="texts",
        processor="text-embedding",
        project=Project.objects.get(name="acme"),
        input_folder=customers / "acme" / "texts",
        user=owner,
    )
    out = _call("folders", "remove", "acme", str(customers / "acme"))
    assert f"project acme no longer reads {customers / 'acme'}" in out
    assert "1 campaign of acme now lie outside its folders" in out and "texts" in out
    with pytest.raises(FolderRefused, match="taken from the project"):
        setup.campaign_import(campaign=campaign)


# --- the operator's command line --------------------------------------------------


def test_folders_add_list_and_remove(owner, shared, tmp_path):
    Project.objects.create(name="acme")
    os.symlink(shared / "acme", shared / "acme-link")
    out = _call("folders", "add", "acme", str(shared / "acme-link"), "--as", "owner")
    assert f"project acme may read {shared / 'acme'} (given as {shared / 'acme-link'})" in out
    assert "already" in _call("folders", "add", "acme", str(shared / "acme"))

    listed = json.loads(_call("folders", "list", "--json"))
    assert listed == [
        {
            "project": "acme",
            "path": str(shared / "acme"),
            "added_by": "owner",
            "created_at": listed[0]["created_at"],
            "exists": True,
            "in_corpus_roots": True,
        }
    ]
    assert str(shared / "acme") in _call("folders", "list", "acme")

    assert "no longer reads" in _call("folders", "remove", "acme", str(shared / "acme"))
    assert not ProjectFolder.objects.exists()
    assert "no project has a folder" in _call("folders", "list")


def test_folders_add_refuses_what_is_outside_corpus_roots_or_not_there(shared, tmp_path):
    Project.objects.create(name="acme")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(CommandError, match="outside CORPUS_ROOTS"):
        _call("folders", "add", "acme", str(elsewhere))
    # a symlink inside a root that leads out of it is judged by where it leads
    os.symlink(elsewhere, shared / "inside-looking")
    with pytest.raises(CommandError, match="outside CORPUS_ROOTS"):
        _call("folders", "add", "acme", str(shared / "inside-looking"))
    with pytest.raises(CommandError, match="is not a folder on this machine"):
        _call("folders", "add", "acme", str(shared / "missing"))
    with pytest.raises(CommandError, match="no project named 'nobody'"):
        _call("folders", "add", "nobody", str(shared))
    with pytest.raises(CommandError, match="is not a folder of project acme"):
        _call("folders", "remove", "acme", str(shared))
    assert not ProjectFolder.objects.exists()


def test_folders_add_can_make_the_project_and_warns_of_a_shared_folder(shared):
    (shared / "common").mkdir()
    _call("folders", "add", "acme", str(shared / "common"), "--create-project")
    out = _call("folders", "add", "beta", str(shared), "--create-project")
    assert "made project beta" in out
    assert "note: project acme also read this folder" in out


def test_the_operators_campaign_create_gives_the_project_its_folder_and_keeps_working(
    tmp_path, settings
):
    # given: a folder outside CORPUS_ROOTS, as the operator may name one
    settings.CORPUS_ROOTS = [tmp_path / "roots"]
    corpus = tmp_path / "anywhere" / "corpus"
    shutil.copytree(DEMO_CORPUS, corpus)

    out = _call(
        "create", "ops", "--processor", "text-embedding", "--input", str(corpus), "--project", "x"
    )

    # then: created, and its folder recorded as project x's (said once)
    assert "created campaign ops" in out
    assert f"project x may now read {corpus}" in out
    assert list(ProjectFolder.objects.values_list("project__name", "path")) == [("x", str(corpus))]
    assert "0 new units" in _call("import", "ops")
    out = _call(
        "create",
        "ops2",
        "--processor",
        "text-embedding",
        "--input",
        str(corpus / "news"),
        "--project",
        "x",
    )
    assert "may now read" not in out  # covered already
    assert "outside CORPUS_ROOTS" in _call("folders", "list", "x")


def test_a_refused_operator_create_leaves_no_folder_behind(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "m.csv").write_bytes("id,path\ncafé,a.txt\n".encode("latin-1"))
    with pytest.raises(CommandError, match="not UTF-8"):
        _call(
            "create",
            "bad",
            "--processor",
            "text-embedding",
            "--manifest",
            str(bad / "m.csv"),
            "--project",
            "x",
        )
    assert not ProjectFolder.objects.exists() and not Campaign.objects.exists()


# --- staff in the admin -----------------------------------------------------------


def test_a_superuser_gives_a_project_a_folder_in_the_admin(client, shared):
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    acme = Project.objects.create(name="acme")
    client.force_login(admin)
    add = reverse("admin:campaigns_projectfolder_add")

    refused = client.post(add, {"project": acme.pk, "path": "/etc"})
    assert refused.status_code == 200
    assert "outside CORPUS_ROOTS" in refused.content.decode()

    response = client.post(add, {"project": acme.pk, "path": f"{shared}/acme/."})
    assert response.status_code == 302
    folder = ProjectFolder.objects.get()
    assert (folder.project, folder.path, folder.added_by) == (acme, str(shared / "acme"), admin)


def test_staff_without_the_permission_and_members_cannot_manage_folders(client, owner, staff):
    add = reverse("admin:campaigns_projectfolder_add")
    client.force_login(staff)
    assert client.get(add).status_code == 403
    client.force_login(owner)
    assert client.get(add).status_code == 302  # to the admin's login


# --- campaigns made before project folders --------------------------------------


def test_the_migration_records_each_campaigns_folder_as_its_projects(make_campaign, corpus):
    import importlib

    from django.apps import apps

    campaign = make_campaign()
    ProjectFolder.objects.all().delete()
    with pytest.raises(FolderRefused):
        setup.campaign_import(campaign=campaign)

    migration = importlib.import_module("campaigns.migrations.0021_project_folders")
    migration.record_campaign_folders(apps, None)

    assert list(ProjectFolder.objects.values_list("project__name", "path")) == [
        ("acme", str(corpus.resolve()))
    ]
    assert setup.campaign_import(campaign=campaign).existing == 39
