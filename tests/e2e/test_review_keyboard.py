"""A reviewer works through flagged classifications with the keyboard only:
r, a reason, Enter rejects; q requeues; ? shows the shortcuts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from PIL import Image

from campaigns.models import Campaign, ErrorClass, ReviewItem, Unit, UnitState
from campaigns.runs import setup
from tests.gpuworker.test_image_classification import (
    CLASSES,
    SIZE,
    classifier_params,
    shape_image,
)
from tests.gpuworker.test_review_flags import calibrated_model  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e


def _two_shapes(rng: random.Random) -> Image.Image:
    """A red circle beside a green square: neither class is the answer."""
    both = Image.new("RGB", (SIZE * 2, SIZE))
    both.paste(shape_image("circle", rng), (0, 0))
    both.paste(shape_image("square", rng), (SIZE, 0))
    return both.resize((SIZE, SIZE))


@pytest.fixture
def shapes(tmp_path) -> Path:
    rng = random.Random(5)
    root = tmp_path / "shapes"
    (root / "clear").mkdir(parents=True)
    (root / "ambiguous").mkdir()
    for i in range(9):
        kind = CLASSES[i % 3]
        shape_image(kind, rng).save(root / "clear" / f"{i}-{kind}.png")
    for i in range(8):
        _two_shapes(rng).save(root / "ambiguous" / f"{i}-circle-square.png")
    return root


def _log_in(page, url: str) -> None:
    page.goto(url)
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url(lambda now: "/review/" in now and "login" not in now)


def test_reject_with_a_reason_and_requeue_using_only_the_keyboard(
    page,
    live_server,
    owner,
    project,
    shapes,
    calibrated_model,  # noqa: F811 (the imported fixture)
    output_root,
    run_here,
    transactional_db,
):
    # The plain tiny CNN (user_model) is sure of itself on two shapes too (margins
    # above 0.96): the one trained with soft labels answers close to both classes.
    campaign, _ = setup.campaign_create(
        name="shapes",
        processor="image-classification",
        project=project,
        input_folder=shapes,
        params=classifier_params(
            calibrated_model, top_k=3, flag_min_margin=0.3, flag_min_confidence=0.6
        ),
    )
    # No checkpoint: the queue holds what the flag rules sent, nothing else.
    Campaign.objects.filter(pk=campaign.pk).update(checkpoint_after=0)
    campaign.refresh_from_db()
    run_here(campaign)
    flagged = ReviewItem.objects.filter(campaign=campaign, state="open").order_by("pk")
    flagged_uids = set(flagged.values_list("unit__uid", flat=True))
    assert len(flagged_uids) >= 2  # close to two categories: low margin
    assert {uid.split("/")[0] for uid in flagged_uids} == {"ambiguous"}

    page.set_viewport_size({"width": 1024, "height": 768})  # a small laptop's screen
    _log_in(page, f"{live_server.url}/review/?campaign=shapes")
    pane = page.locator("#review-item")
    # The first item's pane loads after the page: measured once it is there.
    pane.locator("#input-thumbnail").wait_for()
    # The list keeps to its column: its last column is not hidden under the pane.
    state_header = page.locator("table.review-list th").last.bounding_box()
    assert state_header["x"] + state_header["width"] <= pane.bounding_box()["x"]
    assert pane.locator("#input-thumbnail").get_attribute("src").startswith("data:image/png")
    assert "Margin" in pane.inner_text()

    # ? shows the shortcuts, documented on the page
    page.keyboard.press("?")
    assert page.locator("#review-help").evaluate("el => el.open") is True
    assert "requeue" in page.locator("#review-help").inner_text()
    page.keyboard.press("Escape")

    # r, a reason, Enter: rejected
    first_item = int(pane.get_attribute("data-item"))
    first = ReviewItem.objects.get(pk=first_item).unit
    page.keyboard.press("r")
    assert page.evaluate("document.activeElement.name") == "note"
    page.keyboard.type("two shapes, neither label fits")
    page.keyboard.press("Enter")
    page.locator("#review-notice", has_text=f"Rejected {first.uid}").wait_for()
    assert "now failed (rejected_by_review)" in page.locator("#review-notice").inner_text()
    assert page.locator(f"#row-{first_item}").get_attribute("data-state") == "rejected"
    first.refresh_from_db()
    assert (first.state, first.error_class) == (UnitState.FAILED, ErrorClass.REJECTED_BY_REVIEW)
    assert "two shapes, neither label fits" in first.error_message

    # the next open item is shown; q requeues it
    second_item = int(pane.get_attribute("data-item"))
    assert second_item != first_item
    second = ReviewItem.objects.get(pk=second_item).unit
    assert second.pk != first.pk  # the rejected unit's other flags wait at the end
    page.keyboard.press("q")
    page.locator("#review-notice", has_text=f"Requeued {second.uid}").wait_for()
    notice = page.locator("#review-notice").inner_text()
    assert "the unit is now pending, to run under a new parameter version" in notice
    assert Unit.objects.get(pk=second.pk).state == UnitState.PENDING
    assert ReviewItem.objects.get(pk=second_item).state == "requeued"

    # u undoes the requeue: the item is open again and stays shown; j moves on
    page.keyboard.press("u")
    page.locator("#review-notice", has_text=f"Reopened {second.uid}").wait_for()
    assert int(pane.get_attribute("data-item")) == second_item
    assert Unit.objects.get(pk=second.pk).state == UnitState.NEEDS_REVIEW
    page.keyboard.press("j")
    page.wait_for_function(
        f"() => document.querySelector('#review-item').dataset.item != '{second_item}'"
    )
    assert int(pane.get_attribute("data-item")) > second_item
