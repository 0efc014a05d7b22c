"""Audio transformation: resample, mono, trim or pad, loudness, convert to
WAV, FLAC or OGG/Vorbis — the spec side, without torch (the worker side is
gpuworker/processors/audio_transform.py; docs/processors.md, "Built-in:
audio-transform").

A unit's cost is its milliseconds of audio, read from its header: batches
are grouped and the profile sized by the audio's length, not its bytes.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import soundfile
from django.core.exceptions import ValidationError

from campaigns.intake.audio import (
    MAX_SAMPLES,
    MAX_SECONDS,
    Audio,
    AudioInfo,
    decode_audio,
)
from campaigns.intake.inputs import InputError
from campaigns.review.flags import AUDIO_FLAGS
from campaigns.specs.limits import IMAGE_MAX_INPUT_BYTES, input_read_limits
from campaigns.specs.processors import ParamSpec, ProcessorSpec
from campaigns.storage.outputs import NON_FINITE, WRONG_OUTPUT, InvalidOutput

#: format parameter -> (libsndfile format, subtype, suffix, leading bytes)
AUDIO_FORMATS = {
    "wav": ("WAV", "PCM_16", ".wav", b"RIFF"),
    "flac": ("FLAC", "PCM_16", ".flac", b"fLaC"),
    "ogg": ("OGG", "VORBIS", ".ogg", b"OggS"),
}
#: What each output format can hold: (highest rate, most channels). libvorbis
#: crashes the process past its rates rather than refusing them.
FORMAT_LIMITS = {"wav": (768000, 1024), "flac": (655350, 8), "ogg": (192000, 255)}
#: An output's frames may differ from the asked duration by this much: a
#: resampler rounds, and Vorbis pads its last block.
FRAME_SLACK = 0.002  # seconds


def _suffix(params: dict) -> str:
    return AUDIO_FORMATS[params["format"]][2]


def audio_cost(path: Path, params: dict) -> int | None:
    """Milliseconds of audio, from the header alone (1 for an empty clip;
    None for a length the header does not say)."""
    info = soundfile.info(str(path))
    if not info.samplerate or info.frames >= 1 << 62:
        return None
    return max(1, round(info.frames / info.samplerate * 1000))


def output_refusal(info: AudioInfo, params: dict) -> str:
    """Why this input's output cannot be made in the asked format ("" when it can)."""
    rate, channels = output_rate(info, params), output_channels(info, params)
    highest, most = FORMAT_LIMITS[params["format"]]
    fmt = params["format"].upper()
    if rate > highest:
        return (
            f"its output would be {rate:,} Hz, over the {highest:,} {fmt} holds (set sample_rate)"
        )
    if channels > most:
        return f"{channels} channels, over the {most} {fmt} holds (set channels=mono)"
    _, high = expected_seconds(info.seconds, params)
    samples = round(high * rate) * channels
    if samples > int(params["max_samples"]):
        return (
            f"its output would hold {samples:,} samples, over max_samples {params['max_samples']:,}"
        )
    return ""


def expected_seconds(seconds: float, params: dict) -> tuple[float, float]:
    """The shortest and longest output an input of `seconds` may give."""
    target = float(params["seconds"])
    length = params["length"]
    if length == "exact":
        return target, target
    if length == "trim":
        return min(seconds, target), min(seconds, target)
    if length == "pad":
        return max(seconds, target), max(seconds, target)
    return seconds, seconds


def output_rate(info: AudioInfo, params: dict) -> int:
    return int(params["sample_rate"]) or info.rate


def output_channels(info: AudioInfo, params: dict) -> int:
    return 1 if params["channels"] == "mono" else info.channels


def check_audio_output(data: bytes, params: dict, source: AudioInfo | None = None) -> Audio:
    """The output decodes, in the asked format, rate and channels, with the
    asked duration: exactly what its input gives when the input's facts are
    known (the worker's check), else what the parameters alone say (verify)."""
    fmt = AUDIO_FORMATS[params["format"]][0]
    try:
        out = decode_audio(data)
    except InputError as exc:
        raise InvalidOutput(f"unreadable audio: {exc.message}", WRONG_OUTPUT) from None
    info = out.info
    if info.format != fmt:
        raise InvalidOutput(f"{info.format}, asked {fmt}", WRONG_OUTPUT)
    rate = int(params["sample_rate"])
    if source is not None:
        rate = output_rate(source, params)
    if rate and info.rate != rate:
        raise InvalidOutput(f"{info.rate} Hz, asked {rate}", WRONG_OUTPUT)
    channels = 1 if params["channels"] == "mono" else None
    if source is not None:
        channels = output_channels(source, params)
    if channels is not None and info.channels != channels:
        raise InvalidOutput(f"{info.channels} channel(s), asked {channels}", WRONG_OUTPUT)
    low, high = (None, None)
    if source is not None:
        low, high = expected_seconds(source.seconds, params)
    elif params["length"] == "exact":
        low = high = float(params["seconds"])
    elif params["length"] == "trim":
        high = float(params["seconds"])
    elif params["length"] == "pad":
        low = float(params["seconds"])
    slack = FRAME_SLACK + 2 / info.rate
    if (low is not None and info.seconds < low - slack) or (
        high is not None and info.seconds > high + slack
    ):
        said = f"{low:.3f} s" if low == high else f"{low or 0:.3f}–{high or math.inf:.3f} s"
        raise InvalidOutput(f"{info.seconds:.3f} s long, asked {said}", WRONG_OUTPUT)
    if not np.isfinite(out.samples).all():
        raise InvalidOutput("NaN or infinite samples", NON_FINITE)
    return out


def _quick_check(path: Path, expected: int | None, params: dict) -> None:
    size = path.stat().st_size
    if expected is not None and size != expected:
        raise InvalidOutput(f"size {size} bytes, recorded {expected}")
    magic = AUDIO_FORMATS[params["format"]][3]
    with open(path, "rb") as fh:
        if fh.read(len(magic)) != magic:
            raise InvalidOutput(f"not a {params['format'].upper()} file", WRONG_OUTPUT)


def _deep_check(path: Path, params: dict) -> None:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidOutput(f"unreadable: {exc}") from exc
    check_audio_output(data, params)


def _check_input(data: bytes, params: dict) -> Audio:
    audio = decode_audio(
        data, float(params["max_seconds"]), int(params["max_samples"]), getattr(data, "name", "")
    )
    refusal = output_refusal(audio.info, params)
    if refusal:
        raise InputError("input_invalid", refusal)
    return audio


def _validate(params: dict) -> None:
    rate = int(params["sample_rate"])
    if rate and rate < 1000:
        raise ValidationError("sample_rate: 0 (keep each input's) or at least 1000 Hz")
    highest = FORMAT_LIMITS[params["format"]][0]
    if rate > highest:
        raise ValidationError(
            f"sample_rate: {params['format'].upper()} holds at most {highest:,} Hz"
        )
    if params["length"] != "keep" and float(params["seconds"]) <= 0:
        raise ValidationError("seconds: above 0 for length trim, pad or exact")
    if params["length"] in ("pad", "exact") and rate:
        frames = round(float(params["seconds"]) * rate)
        if frames > int(params["max_samples"]):
            raise ValidationError(
                f"seconds: {params['seconds']:g} s at {rate:,} Hz is {frames:,} frames an output, "
                f"over max_samples {params['max_samples']:,}"
            )


AUDIO_TRANSFORM = ProcessorSpec(
    name="audio-transform",
    title="Audio transformation",
    help="Resample, mix to mono, trim or pad, normalise loudness, convert to WAV, FLAC or "
    "OGG; CPU only.",
    output_suffix=".flac",
    suffix_for=_suffix,
    implementation="gpuworker.processors.audio_transform:AudioTransformProcessor",
    params={
        "format": ParamSpec("flac", choices=tuple(AUDIO_FORMATS), help="the output's format"),
        "sample_rate": ParamSpec(
            16000, type=int, minimum=0, maximum=768000, help="Hz; 0 keeps each input's"
        ),
        "channels": ParamSpec(
            "mono", choices=("mono", "keep"), help="mono: the channels' mean; keep: as they are"
        ),
        "length": ParamSpec(
            "keep",
            choices=("keep", "trim", "pad", "exact"),
            help="trim to at most `seconds`, pad with silence to at least, or exactly",
        ),
        "seconds": ParamSpec(10.0, type=float, minimum=0, maximum=86400),
        "loudness": ParamSpec(
            "none",
            choices=("none", "rms", "peak"),
            help="scale each output so its RMS or its peak is target_dbfs (never past full "
            "scale: an RMS gain that would clip is lowered, and said)",
        ),
        "target_dbfs": ParamSpec(-20.0, type=float, minimum=-100, maximum=0),
        "max_seconds": ParamSpec(
            MAX_SECONDS,
            type=float,
            minimum=0.001,
            help="a longer input fails input_invalid, read from its header before it is decoded",
        ),
        "max_samples": ParamSpec(
            MAX_SAMPLES,
            type=int,
            minimum=1,
            help="an input (frames × channels) or output holding more samples fails "
            "input_invalid, from its header: 4 bytes each in the worker's memory",
        ),
        "max_input_bytes": IMAGE_MAX_INPUT_BYTES,
        "batch_size": ParamSpec(16, type=int, minimum=1, maximum=4096),
        "batch_policy": ParamSpec("original", choices=("original", "length_grouped")),
        **AUDIO_FLAGS,
    },
    quick_check=_quick_check,
    deep_check=_deep_check,
    cost=audio_cost,
    cost_params=(),  # milliseconds: the audio's own
    cost_unit="audio ms",
    check_input=_check_input,
    validate=_validate,
    read_limits=input_read_limits,
)


def encode_audio(samples: np.ndarray, rate: int, params: dict) -> bytes:
    """Samples (frames, channels) in the asked format; InputError (that unit
    fails, not its batch) for what the encoder refuses."""
    fmt, subtype, _, _ = AUDIO_FORMATS[params["format"]]
    buffer = io.BytesIO()
    try:
        soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    except (soundfile.LibsndfileError, RuntimeError, ValueError) as exc:
        raise InputError(
            "input_invalid", f"cannot be written as {fmt} at {rate:,} Hz: {exc}"
        ) from None
    return buffer.getvalue()
