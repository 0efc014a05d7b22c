"""The audio transformation on tones and noise made by the test: every
option's output decodes with the asked format, rate, channels and length;
loudness reaches its target; bad audio is refused with its reason; outputs
that do not hold what was asked are refused; the review rules."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile
from django.core.exceptions import ValidationError

from campaigns.intake.audio import audio_info, decode_audio
from campaigns.intake.inputs import InputError
from campaigns.review.flags import FlagReason
from campaigns.specs.audio import AUDIO_TRANSFORM, check_audio_output, encode_audio
from campaigns.storage.outputs import InvalidOutput
from gpuworker.processors.audio_transform import AudioTransformProcessor
from tests.audio import bad_clips, encoded, noise, tone


def _processor(**params) -> AudioTransformProcessor:
    return AudioTransformProcessor(AUDIO_TRANSFORM.clean(params))


def _through(processor: AudioTransformProcessor, data: bytes, tmp_path: Path):
    """One input through prepare, run, serialize and the worker's check."""
    result = processor.run([processor.prepare(data)])
    out = tmp_path / f"out{processor.suffix}"
    out.write_bytes(processor.serialize(processor.output(result, 0)))
    processor.validate(out)
    decoded, rate = soundfile.read(out, dtype="float32", always_2d=True)
    return result, decoded, rate, soundfile.info(str(out))


@pytest.mark.parametrize("fmt", ["wav", "flac", "ogg"])
@pytest.mark.parametrize("channels", ["mono", "keep"])
def test_the_output_decodes_with_the_asked_format_rate_and_channels(fmt, channels, tmp_path):
    stereo = encoded(tone(1.5, rate=44100, channels=2), 44100, "WAV", "PCM_16")
    processor = _processor(format=fmt, sample_rate=16000, channels=channels)
    result, decoded, rate, info = _through(processor, stereo, tmp_path)
    assert rate == 16000 and info.format == {"wav": "WAV", "flac": "FLAC", "ogg": "OGG"}[fmt]
    assert decoded.shape[1] == (1 if channels == "mono" else 2)
    assert abs(decoded.shape[0] / rate - 1.5) < 0.01
    metrics = processor.unit_metrics(result, 0)
    assert (metrics["input_rate"], metrics["input_channels"]) == (44100, 2)
    assert metrics["input_seconds"] == 1.5 and metrics["output_rate"] == 16000
    # the tone survives: its strongest frequency is still 440 Hz
    spectrum = np.abs(np.fft.rfft(decoded[:, 0]))
    assert abs(np.argmax(spectrum) * rate / len(decoded) - 440) < 5


@pytest.mark.parametrize(
    ("length", "seconds", "expected"),
    [("trim", 1.0, 1.0), ("trim", 5.0, 2.5), ("pad", 4.0, 4.0), ("pad", 1.0, 2.5)]
    + [("exact", 1.0, 1.0), ("exact", 4.0, 4.0), ("keep", 1.0, 2.5)],
)
def test_trim_pad_and_exact_lengths(length, seconds, expected, tmp_path):
    data = encoded(noise(2.5, rate=8000), 8000, "WAV", "PCM_16")
    processor = _processor(format="wav", sample_rate=0, length=length, seconds=seconds)
    _, decoded, rate, _ = _through(processor, data, tmp_path)
    assert rate == 8000 and decoded.shape[0] == round(expected * 8000)
    if length in ("pad", "exact") and expected > 2.5:
        assert not decoded[round(2.5 * 8000) :].any()  # silence after the input


def test_loudness_reaches_its_target_without_clipping(tmp_path):
    quiet = encoded(tone(1.0, amplitude=0.01), 16000, "WAV", "FLOAT")
    _, decoded, _, _ = _through(
        _processor(format="wav", loudness="peak", target_dbfs=-3), quiet, tmp_path
    )
    assert abs(20 * np.log10(np.abs(decoded).max()) + 3) < 0.1
    processor = _processor(format="wav", loudness="rms", target_dbfs=-20)
    result, decoded, _, _ = _through(processor, quiet, tmp_path)
    assert abs(20 * np.log10(np.sqrt(np.mean(decoded**2))) + 20) < 0.1
    # an RMS target a peaky input cannot reach without clipping: lowered, and said
    spiky = tone(1.0, amplitude=0.01)
    spiky[100] = 0.9
    processor = _processor(format="wav", loudness="rms", target_dbfs=-3)
    result, decoded, _, _ = _through(processor, encoded(spiky, 16000, "WAV", "FLOAT"), tmp_path)
    # the peak brought to full scale, the RMS short of its target
    assert np.abs(decoded).max() > 0.99
    assert 20 * np.log10(np.sqrt(np.mean(decoded**2))) < -10
    assert processor.unit_metrics(result, 0)["gain_limited"] is True


@pytest.mark.parametrize("name", sorted(bad_clips()))
def test_bad_audio_is_refused_with_its_reason(name):
    data, said = bad_clips()[name]
    processor = _processor(max_seconds=2)
    with pytest.raises(InputError, match=said) as info:
        processor.prepare(data)
    assert info.value.error_class == "input_invalid"
    with pytest.raises(InputError, match=said):
        AUDIO_TRANSFORM.check_input(data, processor.params)


def test_an_hour_long_file_is_refused_from_its_header_before_it_is_decoded(monkeypatch):
    data = encoded(tone(3.0, rate=8000), 8000, "WAV", "PCM_16")

    def never(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(soundfile, "read", never)
    with pytest.raises(InputError, match="3.0 s of audio, over max_seconds 2"):
        decode_audio(data, max_seconds=2)


def test_other_formats_decode_whatever_their_name(tmp_path):
    for fmt, subtype in (("FLAC", None), ("OGG", "VORBIS"), ("AIFF", "PCM_16")):
        data = encoded(tone(0.5, rate=22050), 22050, fmt, subtype)
        _, decoded, rate, _ = _through(_processor(format="wav"), data, tmp_path)
        assert rate == 16000 and abs(decoded.shape[0] - 8000) <= 2


def test_the_cost_is_the_audios_milliseconds(tmp_path):
    (tmp_path / "a.wav").write_bytes(encoded(tone(1.25), 16000, "WAV", "PCM_16"))
    (tmp_path / "b.flac").write_bytes(encoded(tone(0.5, rate=8000), 8000, "FLAC"))
    (tmp_path / "c.wav").write_bytes(b"no audio")
    params = AUDIO_TRANSFORM.clean({})
    assert AUDIO_TRANSFORM.weigh(tmp_path, ["a.wav", "b.flac", "c.wav"], params) == [
        1250,
        500,
        None,
    ]


def test_an_output_that_does_not_hold_what_was_asked_is_refused(tmp_path):
    params = AUDIO_TRANSFORM.clean({"format": "wav", "length": "exact", "seconds": 1.0})
    good = encoded(tone(1.0), 16000, "WAV", "PCM_16")
    check_audio_output(good, params)
    for bad, said in (
        (encoded(tone(1.0, rate=8000), 8000, "WAV", "PCM_16"), "8000 Hz, asked 16000"),
        (encoded(tone(1.0, channels=2), 16000, "WAV", "PCM_16"), "2 channel"),
        (encoded(tone(0.9), 16000, "WAV", "PCM_16"), "0.900 s long, asked 1.000 s"),
        (encoded(tone(1.0), 16000, "FLAC"), "FLAC, asked WAV"),
        (good[: len(good) // 2], "truncated"),
        (b"RIFF", "unreadable audio"),
    ):
        with pytest.raises(InvalidOutput, match=said):
            check_audio_output(bad, params)
        path = tmp_path / "out.wav"
        path.write_bytes(bad)
        with pytest.raises(InvalidOutput):
            AUDIO_TRANSFORM.deep_check(path, params)


def test_the_review_rules_flag_silent_and_clipped_inputs():
    processor = _processor()
    silent = processor.run(
        [processor.prepare(encoded(tone(1.0, amplitude=0.0001), 16000, "WAV", "FLOAT"))]
    )
    assert [r for r, _ in processor.flags(silent, 0)] == [FlagReason.SILENT_AUDIO]
    clipped_tone = np.clip(tone(1.0, amplitude=2.0), -1, 1)
    clipped = processor.run([processor.prepare(encoded(clipped_tone, 16000, "WAV", "FLOAT"))])
    assert [r for r, _ in processor.flags(clipped, 0)] == [FlagReason.CLIPPED_AUDIO]
    fine = processor.run([processor.prepare(encoded(tone(1.0), 16000, "WAV", "PCM_16"))])
    assert processor.flags(fine, 0) == []


def test_the_version_refuses_what_cannot_be_made():
    with pytest.raises(ValidationError, match="at least 1000 Hz"):
        AUDIO_TRANSFORM.clean({"sample_rate": 500})
    with pytest.raises(ValidationError, match="above 0"):
        AUDIO_TRANSFORM.clean({"length": "exact", "seconds": 0})
    assert AUDIO_TRANSFORM.suffix(AUDIO_TRANSFORM.clean({"format": "ogg"})) == ".ogg"


def _wav_u8(frames: int) -> bytes:
    return encoded(tone(frames / 8000, rate=8000), 8000, "WAV", "PCM_U8")


@pytest.mark.parametrize(
    ("data", "params", "said"),
    [
        # libvorbis would crash the worker on this rate: refused from the header
        (
            encoded(tone(0.01, rate=384000), 384000, "WAV", "PCM_16"),
            {"format": "ogg", "sample_rate": 0},
            "over the 192,000 OGG holds",
        ),
        (
            encoded(tone(0.1, channels=10), 16000, "WAV", "PCM_16"),
            {"format": "flac", "channels": "keep"},
            "10 channels, over the 8 FLAC holds",
        ),
        (
            encoded(tone(0.5), 16000, "WAV", "PCM_16"),
            {"length": "pad", "seconds": 100, "max_samples": 1_000_000, "sample_rate": 0},
            "over max_samples",
        ),
        (
            encoded(tone(1.0, channels=4), 16000, "WAV", "PCM_16"),
            {"max_samples": 40_000},
            "64,000 samples (4 channels × 16,000 frames), over max_samples 40,000",
        ),
        (
            encoded(tone(1 / 44100, rate=44100), 44100, "WAV", "PCM_16"),
            {"sample_rate": 8000},
            "too short",
        ),
    ],
)
def test_inputs_whose_output_cannot_be_made_fail_alone_before_they_are_decoded(data, params, said):
    processor = _processor(**params)
    with pytest.raises(InputError, match=re.escape(said)) as info:
        processor.prepare(data)
    assert info.value.error_class == "input_invalid"


def test_what_the_encoder_refuses_fails_its_unit_not_its_batch():
    with pytest.raises(InputError, match="cannot be written as FLAC"):
        encode_audio(tone(0.1, channels=10), 16000, AUDIO_TRANSFORM.clean({"format": "flac"}))
    with pytest.raises(ValidationError, match="FLAC holds at most 655,350 Hz"):
        AUDIO_TRANSFORM.clean({"format": "flac", "sample_rate": 700000})


@pytest.mark.parametrize("fmt", ["OGG", "RF64", "AIFF"])
def test_a_cut_file_is_refused_whatever_its_format(fmt):
    subtype = "VORBIS" if fmt == "OGG" else "PCM_16"
    whole = encoded(tone(2.0), 16000, fmt, subtype)
    decode_audio(whole)
    for share in (0.3, 0.7, 0.95):
        with pytest.raises(InputError, match="truncated"):
            decode_audio(whole[: int(len(whole) * share)])


def test_a_whole_wav_with_odd_framing_is_read():
    # an odd data chunk without its pad byte: every sample is there
    odd = _wav_u8(145)
    assert len(odd) % 2 == 0 and odd.endswith(b"\x00")
    assert decode_audio(odd[:-1]).info.frames == 145
    # a writer that counted the RIFF size as the file's length
    short_riff = odd[:4] + (len(odd)).to_bytes(4, "little") + odd[8:]
    assert decode_audio(short_riff).info.frames == 145


def test_an_mp3_is_read_by_its_header_length_and_one_without_it_refused():
    mp3 = encoded(tone(2.0, rate=22050), 22050, "MP3", "MPEG_LAYER_III")
    audio = decode_audio(mp3)
    assert abs(audio.info.seconds - 2.0) < 0.1
    unheaded = mp3
    for tag in (b"Xing", b"Info", b"VBRI"):
        unheaded = unheaded.replace(tag, b"Nope")
    with pytest.raises(InputError, match="without a Xing, Info or VBRI header"):
        decode_audio(unheaded)


def test_a_name_that_says_another_format_is_recorded_and_flagged():
    flac = encoded(tone(1.0), 16000, "FLAC")
    info = audio_info(flac, name="calls/monday.wav")
    assert (info.format, info.named_as) == ("FLAC", "WAV")
    assert audio_info(flac, name="calls/monday.flac").named_as == ""
    assert audio_info(flac, name="calls/monday").named_as == ""
