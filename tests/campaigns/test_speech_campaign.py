"""A speech-to-text campaign as a user makes one: `campaign create` over a
folder of recordings with bad ones among them, run, verified, and shown in
the review pane and on the unit page: the audio playable beside its
transcript and timed segments."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from campaigns.models import Campaign, Unit, UnitState
from campaigns.review.queue import unit_flag
from campaigns.verify.reconcile import campaign_verify
from tests.audio import bad_clips, encoded, noise, tone
from tests.speech import tiny_whisper


@pytest.mark.django_db
def test_a_speech_campaign_runs_and_shows_each_transcript_beside_its_audio(
    tmp_path, output_root, run_here, project, client, admin_user
):
    model = tiny_whisper(tmp_path / "whisper")
    corpus = tmp_path / "calls"
    (corpus / "bad").mkdir(parents=True)
    (corpus / "short.wav").write_bytes(encoded(tone(2.0, rate=8000), 8000))
    (corpus / "long.flac").write_bytes(encoded(noise(45.0, rate=16000, channels=2), 16000, "FLAC"))
    (corpus / "ogg.ogg").write_bytes(encoded(noise(5.0, rate=22050), 22050, "OGG", "VORBIS"))
    bad = bad_clips()
    for name, (data, _) in bad.items():
        (corpus / "bad" / name).write_bytes(data)
    call_command(
        "campaign",
        "create",
        "calls",
        "--processor=speech-to-text",
        f"--input={corpus}",
        f"--project={project.name}",
        f"--param=model={model}",
        "--param=max_new_tokens=12",
        "--param=max_seconds=60",
        stdout=StringIO(),
    )
    campaign = Campaign.objects.get(name="calls")
    run_here(campaign)

    failed = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    refused = {f"bad/{n}": said for n, (_, said) in bad.items() if n != "hour.wav"}
    assert set(failed) == set(refused)
    for uid, said in refused.items():
        assert said in failed[uid], (uid, failed[uid])
    done = Unit.objects.filter(
        campaign=campaign, state__in=(UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW)
    )
    assert sorted(done.values_list("uid", flat=True)) == [
        "bad/hour.wav",  # 3 s: within max_seconds here
        "long.flac",
        "ogg.ogg",
        "short.wav",
    ]
    for unit in done:
        record = json.loads((output_root / unit.output_path).read_text())
        attempt = unit.attempts.get()
        assert record["language"] == attempt.metrics["language"]
        assert record["task"] == "transcribe"
    long = json.loads((output_root / done.get(uid="long.flac").output_path).read_text())
    assert (
        long["seconds"] == 45.0 and done.get(uid="long.flac").attempts.get().metrics["windows"] == 2
    )
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["input_invalid"] == len(refused) and report["output_missing"] == 0
    assert report["valid"] == done.filter(state=UnitState.SUCCEEDED).count() >= 1

    # the unit page: the recording to play, and what was heard, with its times
    client.force_login(admin_user)
    unit = done.get(uid="long.flac")
    page = client.get(reverse("unit_detail", args=["calls", unit.pk])).content.decode()
    assert 'id="input-audio"' in page and "<h3>Transcript</h3>" in page
    assert f"transcribe, language {long['language']}, 45.0 s" in page
    assert long["segments"], long  # the random model writes some words into 45 s of noise
    for segment in long["segments"][:3]:
        assert f"<td>{segment['start']:.2f}</td>" in page

    # a transcript flagged by hand waits in the queue beside its audio
    item = unit_flag(unit=unit, user=admin_user, note="listen again")
    pane = client.get(
        f"{reverse('review_queue')}?campaign=calls&item={item.pk}", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'id="input-audio"' in pane and "<h3>Transcript</h3>" in pane
    assert "listen again" in pane
