from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import factory
import hypothesis
import pytest
from django.contrib.auth import get_user_model

from campaigns.models import Project
from campaigns.runs import setup, start

# Property-based tests (tests/fuzzing.py): the same examples every run (derandomize),
# nothing written to the repository (no example database), one second an
# example at most. HYPOTHESIS_PROFILE=explore searches wider and at random.
hypothesis.settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=1000,
    max_examples=150,
    print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.register_profile(
    "explore", parent=hypothesis.settings.get_profile("ci"), derandomize=False, max_examples=2000
)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DEMO_CORPUS = Path(__file__).resolve().parent.parent / "campaigns" / "demo_corpus"
# The demo corpus: 35 texts that embed, 4 bad inputs that must fail with a reason.
DEMO_GOOD, DEMO_BAD = 35, 4


def services_required() -> bool:
    """In CI a missing service or browser fails the test instead of skipping it."""
    return os.environ.get("REQUIRE_SERVICES") == "1"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-for-tests")


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    name = factory.Sequence(lambda n: f"project-{n}")


@pytest.fixture
def owner(db):
    return UserFactory(username="owner")


@pytest.fixture
def outsider(db):
    return UserFactory(username="outsider")


@pytest.fixture
def staff(db):
    """A staff account in the staff group: `is_staff` alone may not verify payments."""
    from portal.staff_group import staff_group_sync

    user = UserFactory(username="staff", is_staff=True)
    # The group comes with migrate; a transactional test's flush may have taken it.
    user.groups.add(staff_group_sync())
    return user


@pytest.fixture
def project(owner):
    project = ProjectFactory(name="acme")
    project.members.add(owner)
    return project


@pytest.fixture
def allow_folder(request, settings, owner):
    """Give a project a folder as staff do (`campaign folders add`): `project`
    (default acme, the `project` fixture's, with `owner` as its member) may then
    make campaigns over `folder` on the setup page. The folder's parent joins
    CORPUS_ROOTS unless a root holds it already."""
    from campaigns.intake import project_folders

    def allow(folder: Path, *, project: str = "acme", members=None):
        if not project_folders.in_corpus_roots(project_folders.real_path(folder)):
            settings.CORPUS_ROOTS = [*settings.CORPUS_ROOTS, Path(folder).parent]
        if project == "acme":
            owning = request.getfixturevalue("project")
        else:
            owning, _ = Project.objects.get_or_create(name=project)
        owning.members.add(*(members if members is not None else [owner]))
        return project_folders.folder_add(project=owning, path=folder)[0]

    return allow


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A private copy of the demo corpus: tests must never write next to originals."""
    target = tmp_path / "corpus"
    shutil.copytree(DEMO_CORPUS, target)
    return target


@pytest.fixture
def output_root(tmp_path, settings) -> Path:
    root = tmp_path / "outputs"
    settings.OUTPUT_ROOT = root
    return root


@pytest.fixture
def make_campaign(project, corpus):
    def make(name: str = "texts", **params):
        if "batch_size" in params:
            # A test that sizes its batches in texts means a count policy:
            # the default, token_budget, does not read batch_size.
            params.setdefault("batch_policy", "length_grouped")
        campaign, _ = setup.campaign_create(
            name=name,
            processor="text-embedding",
            project=project,
            input_folder=corpus,
            params=params or None,
        )
        return campaign

    return make


@pytest.fixture
def run_here(django_capture_on_commit_callbacks):
    """Queue a campaign's pending units, then run every batch in this process.

    The broker send is captured: tests of task bodies run them here; the
    integration tests run them in real worker processes.
    """
    from unittest import mock

    from campaigns.models import Batch
    from gpuworker.runner.batch import run_batch

    def run(campaign) -> None:
        with (
            mock.patch.object(start.celery_app, "send_task"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            start.campaign_run(campaign=campaign)
        queued = Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED)
        for pk in queued.order_by("pk").values_list("pk", flat=True):
            run_batch(pk)

    return run


# --- ordering portal ---------------------------------------------------------
# The catalog (GPUs, environments, durations, currencies) comes from the data
# migration; rates and payment addresses are the operator's, made here.

# A real public key (ssh-keygen -t ed25519): the order form asks for one.
SSH_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIh+nxitNU7kERRlaGoH5vq6fcDua12EgrPILaB6+y81 ada@laptop"
)


def waiting_at_checkpoint(campaign):
    """The campaign's first group (5 units and the holdout) done by one batch, and
    its checkpoint waiting for the spot check: returns the checkpoint."""
    from campaigns.models import Batch, Checkpoint, Unit, UnitState

    campaign.checkpoint_after = 5
    campaign.save(update_fields=["checkpoint_after"])
    version = campaign.current_version
    ran = Batch.objects.create(campaign=campaign, version=version, size=5, state="done")
    first = Unit.objects.filter(campaign=campaign, holdout=False).values_list("pk", flat=True)
    Unit.objects.filter(pk__in=list(first[:5])).update(state=UnitState.SUCCEEDED, batch=ran)
    Unit.objects.filter(campaign=campaign, holdout=True).update(
        state=UnitState.SUCCEEDED, batch=ran
    )
    return Checkpoint.objects.create(campaign=campaign, version=version, after_units=5)


@pytest.fixture
def catalog(db):
    """The seeded catalog, again: a transactional test (live server, worker
    processes) flushes every table, data migrations' rows included."""
    import importlib

    from django.apps import apps

    seed = importlib.import_module("portal.migrations.0002_seed_catalog").seed
    seed(apps, None)


@pytest.fixture
def fresh_rates(catalog):
    from decimal import Decimal

    from django.utils import timezone

    from portal.models import CryptoCurrency, ExchangeRate

    now = timezone.now()
    for code, value in (("BTC", "60000"), ("LTC", "80"), ("XMR", "150")):
        ExchangeRate.objects.create(
            currency=CryptoCurrency.objects.get(code=code),
            fiat_per_unit=Decimal(value),
            recorded_at=now,
        )


@pytest.fixture
def address_pool(catalog):
    from portal.models import CryptoCurrency, PaymentAddress

    for currency in CryptoCurrency.objects.all():
        for i in range(5):
            PaymentAddress.objects.create(currency=currency, address=f"{currency.code}-addr-{i}")


@pytest.fixture
def make_order(fresh_rates, address_pool):
    """An order with its locked quote, through the same service the form uses."""
    from portal.models import CryptoCurrency, Environment, GpuModel
    from portal.order_services import Plan, order_create

    made = iter(range(1, 10_000))

    def make(gpu="A40", quantity=1, days=7, currency="BTC", **fields):
        plan = Plan(
            gpu=GpuModel.objects.get(name=gpu),
            quantity=quantity,
            days=days,
            environment=Environment.objects.first(),
            currency=CryptoCurrency.objects.get(code=currency),
        )
        # Each order a customer of its own (the first one ada@example.org): the
        # cap on open orders per e-mail address is tested where it is meant.
        n = next(made)
        email = "ada@example.org" if n == 1 else f"ada.{n}@example.org"
        contact = {"first_name": "Ada", "last_name": "Lovelace", "email": email}
        return order_create(plan=plan, **{**contact, **fields})

    return make


@pytest.fixture(autouse=True)
def _fresh_rate_limits(monkeypatch):
    """Rate-limit counts live in the cache: each test starts with none.

    django-ratelimit counts in fixed slices of the wall clock, so a "1/m" slice can
    end between a test's two requests and let the second through: the clock it
    reads stands still for the length of a test (tests/portal/test_rate_windows.py).
    """
    import django_ratelimit.core
    from django.core.cache import cache

    cache.clear()
    now = int(time.time())
    monkeypatch.setattr(django_ratelimit.core, "time", SimpleNamespace(time=lambda: now))


@pytest.fixture(autouse=True)
def _no_login_lockouts(request):
    """Failed logins (django-axes) are database rows: a test that has the database
    starts with none, so one test's wrong passwords never lock out another's user
    (a rolled-back transaction or a flush clears them too; this does not depend on it)."""
    for name in ("transactional_db", "db"):
        if name in request.fixturenames:
            request.getfixturevalue(name)
            from axes.models import AccessAttempt

            AccessAttempt.objects.all().delete()  # axes.utils.reset() less its log line
            return


@pytest.fixture
def sent_tasks():
    """Tasks sent by name (campaigns.runs.start.task_send: the lost-link
    page's e-mail), caught before the broker; `run()` hands them to their
    tasks in this process, as the `portal` worker would."""
    from unittest import mock

    from portal import tasks  # noqa: F401 — registers the tasks, as a worker's imports do
    from portal.celery import app

    class Sent(list):
        def run(self) -> None:
            for name, args in self:
                app.tasks[name].apply(args=args, throw=True)
            self.clear()

    sent = Sent()
    with mock.patch.object(
        start.celery_app,
        "send_task",
        side_effect=lambda name, args=(), **_: sent.append((name, list(args))),
    ):
        yield sent
