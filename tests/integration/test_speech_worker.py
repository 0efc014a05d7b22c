"""A speech-to-text campaign through real workers: recordings of several
lengths, rates and channel counts (some longer than a 30 s window), and bad clips; the
worker is SIGKILLed mid-batch twice, a new one finishes, resume finds nothing
left. Every good file then has exactly one transcript, the one the processor
makes of it alone in this process; verify --deep passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.specs.speech import SPEECH_TO_TEXT
from campaigns.verify.reconcile import campaign_verify
from gpuworker.processors.speech_to_text import SpeechToTextProcessor
from tests.audio import bad_clips, encoded, noise
from tests.speech import tiny_whisper
from tests.worker import finish_and_resume, kill_mid_batch

pytestmark = pytest.mark.integration

GOOD = 12
RATES = (16000, 22050, 44100, 8000)


def _recording(i: int) -> bytes:
    rate = RATES[i % len(RATES)]
    return encoded(noise(8 + 9 * (i % 5), rate=rate, channels=1 + i % 2, seed=i), rate, "FLAC")


def test_speech_survives_kills_and_resume_with_one_transcript_a_file(
    start_worker, project, tmp_path, output_root, settings
):
    settings.BATCH_LEASE_SECONDS = 2
    model = tiny_whisper(tmp_path / "whisper")
    corpus = tmp_path / "calls"
    (corpus / "bad").mkdir(parents=True)
    for i in range(GOOD):
        (corpus / f"call-{i:02d}.flac").write_bytes(_recording(i))
    bad = {name: said for name, (data, said) in bad_clips().items() if name != "hour.wav"}
    for name in bad:
        (corpus / "bad" / name).write_bytes(bad_clips()[name][0])
    params = {"model": str(model), "max_new_tokens": 24, "batch_size": 3}
    params |= {"flag_empty": "no"}
    campaign, _ = setup.campaign_create(
        name="speech-killed",
        processor="speech-to-text",
        project=project,
        input_folder=corpus,
        params=params,
    )
    start.campaign_run(campaign=campaign)

    kill_mid_batch(start_worker, campaign, 2, settle=0.1)

    finish_and_resume(start_worker, campaign, timeout=300)
    failed = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    assert set(failed) == {f"bad/{name}" for name in bad}
    for name, said in bad.items():
        assert said in failed[f"bad/{name}"], (name, failed[f"bad/{name}"])
    assert Batch.objects.filter(campaign=campaign, deliveries__gte=2).count() >= 1
    assert not [p for p in Path(output_root).rglob("*") if p.name.endswith(".tmp")]

    processor = SpeechToTextProcessor(SPEECH_TO_TEXT.clean(params))
    for i in range(GOOD):
        unit = Unit.objects.get(campaign=campaign, uid=f"call-{i:02d}.flac")
        assert unit.state in (UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW)
        assert Attempt.objects.filter(unit=unit, outcome="succeeded").count() == 1
        record = json.loads((Path(output_root) / unit.output_path).read_text())
        alone = processor.output(processor.run([processor.prepare(_recording(i))]), 0)
        assert record["text"] == alone.text, unit.uid
        assert record["segments"] == alone.segments
        assert record["seconds"] == round(alone.seconds, 3) == 8 + 9 * (i % 5)
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["input_invalid"] == len(bad)
    assert report["output_missing"] == report["orphan_outputs"] == 0
