"""An audio-transform campaign through real workers: tones at several rates
and channel counts, and bad clips (empty, not audio, cut short, NaN samples,
too long); the worker is SIGKILLed mid-batch twice, a new one finishes, resume
finds nothing left. Every good clip then has exactly one output, the one the
processor makes of it in this process, decoding with the asked rate,
channels and length; verify --deep passes."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile

from campaigns import selectors
from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.specs.audio import AUDIO_TRANSFORM
from campaigns.verify.reconcile import campaign_verify
from gpuworker.processors.audio_transform import AudioTransformProcessor
from tests.audio import bad_clips, encoded, tone
from tests.worker import finish_and_resume, kill_mid_batch

pytestmark = pytest.mark.integration

GOOD = 32
RATES = (44100, 22050, 48000, 16000)


def _clip(i: int) -> bytes:
    rate = RATES[i % len(RATES)]
    samples = tone(20 + i % 7, rate=rate, channels=1 + i % 2, freq=200 + 25 * i)
    return encoded(samples, rate, "FLAC")


def test_audio_survives_kills_and_resume_with_one_output_a_clip(
    start_worker, project, tmp_path, output_root, settings
):
    # given: 32 clips of 20–26 s (each resampled, mixed to mono, cut to 15 s) and 6 bad ones
    settings.BATCH_LEASE_SECONDS = 2
    corpus = tmp_path / "clips"
    (corpus / "bad").mkdir(parents=True)
    for i in range(GOOD):
        (corpus / f"clip-{i:02d}.flac").write_bytes(_clip(i))
    bad = bad_clips()
    for name, (data, _) in bad.items():
        (corpus / "bad" / name).write_bytes(data)
    params = {"format": "flac", "sample_rate": 16000, "channels": "mono", "length": "trim"}
    params |= {"seconds": 15, "loudness": "rms", "target_dbfs": -23, "batch_size": 8}
    params |= {"max_seconds": 60}
    bad["hour.wav"] = (bad["hour.wav"][0], "")  # 3 s: within max_seconds here
    campaign, _ = setup.campaign_create(
        name="audio-killed",
        processor="audio-transform",
        project=project,
        input_folder=corpus,
        params=params,
    )
    start.campaign_run(campaign=campaign)

    # when: a worker is SIGKILLed while it holds a batch, twice
    kill_mid_batch(start_worker, campaign, 2, settle=0.05)

    # then: a new worker (with the sweeper) finishes, and resume finds nothing more
    finish_and_resume(start_worker, campaign, timeout=240)
    refused = {f"bad/{name}": said for name, (_, said) in bad.items() if said}
    counts = selectors.campaign_counts(campaign=campaign)
    assert (counts.succeeded, counts.failed, counts.pending) == (GOOD + 1, len(refused), 0)
    failed = dict(
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED).values_list(
            "uid", "error_message"
        )
    )
    assert set(failed) == set(refused)
    for uid, said in refused.items():
        assert said in failed[uid], (uid, failed[uid])
    assert Batch.objects.filter(campaign=campaign, deliveries__gte=2).count() >= 1

    # exactly one output a clip, the processor's own, with the asked facts; no partial file
    assert not [p for p in Path(output_root).rglob("*") if p.name.endswith(".tmp")]
    processor = AudioTransformProcessor(AUDIO_TRANSFORM.clean(params))
    for i in range(GOOD):
        unit = Unit.objects.get(campaign=campaign, uid=f"clip-{i:02d}.flac")
        assert unit.state == UnitState.SUCCEEDED
        assert Attempt.objects.filter(unit=unit, outcome="succeeded").count() == 1
        path = Path(output_root) / unit.output_path
        info = soundfile.info(str(path))
        assert (info.format, info.samplerate, info.channels) == ("FLAC", 16000, 1)
        assert info.frames == 15 * 16000
        made = processor.run([processor.prepare(_clip(i))])
        assert path.read_bytes() == processor.serialize(processor.output(made, 0)), unit.uid
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["valid"] == GOOD + 1 and report["input_invalid"] == len(refused)
    assert report["output_missing"] == report["orphan_outputs"] == 0
