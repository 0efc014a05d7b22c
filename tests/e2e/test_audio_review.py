"""An audio clip waiting for review plays in the browser: the pane's input
and output players load their audio (data: URLs, allowed by the Content
Security Policy's media-src) with the durations the files have."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from campaigns.models import Campaign, ReviewItem
from tests.audio import encoded, tone

pytestmark = pytest.mark.e2e


def test_the_review_pane_plays_a_clips_input_and_output(
    page, live_server, owner, project, tmp_path, output_root, run_here, transactional_db
):
    corpus = tmp_path / "clips"
    corpus.mkdir()
    (corpus / "quiet.wav").write_bytes(encoded(tone(1.0, amplitude=0.0005, rate=22050), 22050))
    (corpus / "loud.wav").write_bytes(encoded(tone(1.0, rate=22050), 22050))
    call_command(
        "campaign",
        "create",
        "clips",
        "--processor=audio-transform",
        f"--input={corpus}",
        f"--project={project.name}",
        "--param=format=ogg",
        "--param=length=pad",
        "--param=seconds=2",
        stdout=StringIO(),
    )
    run_here(Campaign.objects.get(name="clips"))
    assert ReviewItem.objects.get(reason="silent_audio").unit.uid == "quiet.wav"

    page.goto(f"{live_server.url}/review/?campaign=clips")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url(lambda now: "/review/" in now and "login" not in now)
    page.locator("#review-item #output-audio").wait_for()
    durations = {}
    for player in ("#input-audio", "#output-audio"):
        page.wait_for_function(
            "(id) => document.querySelector(id).readyState >= 1", arg=player, timeout=15_000
        )
        durations[player] = page.eval_on_selector(player, "el => el.duration")
    assert abs(durations["#input-audio"] - 1.0) < 0.05
    assert abs(durations["#output-audio"] - 2.0) < 0.05  # padded to 2 s, OGG/Vorbis
    assert "silent audio" in page.locator("#review-item").inner_text()
