from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import services_required

CHROMIUM = Path("/usr/bin/chromium")
# Playwright's sync API runs an event loop in this thread; the ORM calls the
# tests make between page actions are ordinary blocking calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        message = "Debian's chromium is not installed (apt-get install -y chromium)"
        if services_required():
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture(autouse=True)
def no_page_outlives_its_test(request):
    """A page left open keeps polling the session's live server for the rest of
    the run: its requests then hit tests that allow no database, and the
    server thread's tracebacks race other tests. So every context a test opens
    is closed by the end of its test (`page` and `new_page` do it), or the test
    fails here."""
    yield
    if "browser" not in request.fixturenames:
        return
    browser = request.getfixturevalue("browser")
    left = list(browser.contexts)
    for context in left:
        context.close()
    assert not left, f"{len(left)} browser context(s) left open: use `new_page` or close them"


@pytest.fixture
def csp_violations():
    """What Chromium refused under the Content Security Policy, as console lines."""
    return []


@pytest.fixture
def page(browser, csp_violations):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.on(
        "console",
        lambda msg: "Content Security Policy" in msg.text and csp_violations.append(msg.text),
    )
    yield page
    context.close()
    # Every browser test also proves its pages work under the policy. (A
    # wait_for_function predicate is written as a function, "() => …": an
    # expression string is eval'd in the page, and the policy forbids eval.)
    assert not csp_violations, csp_violations


@pytest.fixture
def new_page(browser, csp_violations):
    """Pages in contexts of their own (a second person, a phone, another time
    zone), watched for CSP refusals as the `page` fixture's are, and closed
    with the test whatever its outcome."""
    contexts = []

    def make(**options):
        context = browser.new_context(**options)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.on(
            "console",
            lambda msg: "Content Security Policy" in msg.text and csp_violations.append(msg.text),
        )
        return page

    yield make
    for context in contexts:
        context.close()
    assert not csp_violations, csp_violations
