"""An audio-transform campaign as a user makes one: `campaign create` over a
folder of clips with bad ones among them, run, verified, and judged in the
review pane: the input and the output playable side by side, with their
facts and what was asked."""

from __future__ import annotations

import base64
import io
from io import StringIO

import pytest
import soundfile
from django.core.management import call_command
from django.urls import reverse

from campaigns.models import Campaign, ReviewItem, Unit, UnitState
from campaigns.verify.reconcile import campaign_verify
from tests.audio import bad_clips, encoded, tone


@pytest.mark.django_db
def test_an_audio_campaign_runs_and_its_review_pane_plays_input_and_output(
    tmp_path, output_root, run_here, project, client, admin_user
):
    corpus = tmp_path / "clips"
    (corpus / "bad").mkdir(parents=True)
    for i in range(5):
        rate = (8000, 22050, 44100)[i % 3]
        (corpus / f"c{i}.wav").write_bytes(encoded(tone(1 + i / 4, rate=rate, channels=2), rate))
    (corpus / "quiet.flac").write_bytes(encoded(tone(1.0, amplitude=0.0005), 16000, "FLAC"))
    (corpus / "mislabelled.wav").write_bytes(encoded(tone(1.0), 16000, "FLAC"))
    bad = bad_clips()
    for name, (data, _) in bad.items():
        (corpus / "bad" / name).write_bytes(data)
    call_command(
        "campaign",
        "create",
        "clips",
        "--processor=audio-transform",
        f"--input={corpus}",
        f"--project={project.name}",
        "--param=format=wav",
        "--param=sample_rate=16000",
        "--param=length=exact",
        "--param=seconds=1.5",
        "--param=max_seconds=2",
        stdout=StringIO(),
    )
    campaign = Campaign.objects.get(name="clips")
    run_here(campaign)

    failed = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    assert set(failed) == {f"bad/{name}" for name in bad}
    for name, (_, said) in bad.items():
        assert said in failed[f"bad/{name}"], (name, failed[f"bad/{name}"])
    done = Unit.objects.filter(
        campaign=campaign, state__in=(UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW)
    )
    expected = [*(f"c{i}.wav" for i in range(5)), "mislabelled.wav", "quiet.flac"]
    assert sorted(done.values_list("uid", flat=True)) == expected
    for unit in done:
        info = soundfile.info(str(output_root / unit.output_path))
        assert (info.samplerate, info.channels, info.frames) == (16000, 1, 24000)
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    # the quiet and the mislabelled clips' outputs wait for their review before they count
    assert report["valid"] == 5 and report["input_invalid"] == len(bad)
    mislabelled = ReviewItem.objects.get(campaign=campaign, reason="wrong_extension")
    assert mislabelled.unit.uid == "mislabelled.wav" and "holds FLAC" in mislabelled.detail
    attempt = mislabelled.unit.attempts.get()
    assert attempt.metrics["named_as"] == "WAV" and attempt.metrics["input_format"] == "FLAC/PCM_16"

    # the quiet clip waits for a person, who hears both sides
    item = ReviewItem.objects.get(campaign=campaign, reason="silent_audio")
    assert item.unit.uid == "quiet.flac"
    client.force_login(admin_user)
    pane = client.get(
        f"{reverse('review_queue')}?campaign=clips&item={item.pk}", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'id="input-audio"' in pane and 'id="output-audio"' in pane
    assert "16,000 Hz, 1 channel, 1.00 s, FLAC" in pane  # the input's facts
    assert "16,000 Hz, 1 channel, 1.50 s, WAV" in pane  # the output's
    assert "16,000 Hz, mono, exact 1.5 s, WAV" in pane  # what was asked
    played = pane.split('id="output-audio"')[0].rsplit('src="data:audio/wav;base64,', 1)[1]
    data = base64.b64decode(played.split('"', 1)[0])
    assert soundfile.info(io.BytesIO(data)).frames == 24000

    # the unit page of a bad clip says why, and plays nothing
    cut = Unit.objects.get(campaign=campaign, uid="bad/notes.wav")
    page = client.get(reverse("unit_detail", args=["clips", cut.pk])).content.decode()
    assert "not audio" in page and "<audio" not in page


@pytest.mark.django_db
def test_the_setup_page_offers_the_audio_fields_from_the_schema(client, owner):
    client.force_login(owner)
    html = client.get(
        reverse("campaign_new"),
        {"processor": "audio-transform"},
        headers={"HX-Request": "true", "HX-Target": "params"},
    ).content.decode()
    for field in ("format", "sample_rate", "channels", "length", "loudness", "max_seconds"):
        assert f'name="param_{field}"' in html, field
    assert '<option value="flac" selected>' in html
