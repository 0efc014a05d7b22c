"""Audio inputs decoded with libsndfile (the `soundfile` package): WAV, FLAC,
OGG/Vorbis, MP3, AIFF and the other formats it reads, told apart by their
content, never by their name.

Every decoded fact is kept (`Audio`: sample rate, channels, frames, seconds,
format) and every bad input fails with a classified, readable reason before
anything is made from it: an empty file, bytes that are no audio (a text file
named `.wav`), a file cut short (its header announces more bytes than it
holds, or the decoder loses sync), a file longer than `max_seconds` (an hour
of audio in a corpus of clips, refused from its header before it is decoded),
no samples at all, NaN or infinite samples. Torch-free: the web process's
previews and checks use it too.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np
import soundfile

from campaigns.intake.inputs import InputError
from campaigns.models import ErrorClass

#: Longest input by default: a corpus of clips, not of recordings.
MAX_SECONDS = 600


@dataclass(frozen=True)
class AudioInfo:
    """What an audio file's header says."""

    rate: int
    channels: int
    frames: int
    format: str  # libsndfile's: WAV, FLAC, OGG, MP3…
    subtype: str

    @property
    def seconds(self) -> float:
        return self.frames / self.rate if self.rate else 0.0


@dataclass(frozen=True)
class Audio:
    info: AudioInfo
    samples: np.ndarray  # (frames, channels) float32 in [-1, 1] as decoded


def audio_info(data: bytes, max_seconds: float = 0) -> AudioInfo:
    """The header's facts, or InputError: no audio, cut short, or over max_seconds."""
    if not data:
        raise InputError(ErrorClass.INPUT_INVALID, "empty file")
    try:
        found = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, ValueError) as exc:
        raise InputError(
            ErrorClass.INPUT_INVALID, f"not audio libsndfile reads ({_said(exc)})"
        ) from None
    info = AudioInfo(
        rate=int(found.samplerate),
        channels=int(found.channels),
        frames=int(found.frames),
        format=str(found.format),
        subtype=str(found.subtype),
    )
    if info.rate <= 0 or info.channels <= 0:
        raise InputError(ErrorClass.INPUT_INVALID, f"{info.format} with no sample rate or channel")
    announced = _announced_bytes(data)
    if announced is not None and announced > len(data):
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"truncated: {len(data):,} of the {announced:,} bytes its {info.format} header "
            "announces",
        )
    if max_seconds and info.seconds > max_seconds:
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"{info.seconds:,.1f} s of audio, over max_seconds {max_seconds:g}",
        )
    return info


def decode_audio(data: bytes, max_seconds: float = 0) -> Audio:
    """The whole file's samples, float32 (frames, channels), with its facts."""
    info = audio_info(data, max_seconds)
    try:
        samples, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, ValueError) as exc:
        raise InputError(ErrorClass.INPUT_INVALID, f"truncated or damaged ({_said(exc)})") from None
    if samples.shape[0] == 0:
        raise InputError(ErrorClass.INPUT_INVALID, f"{info.format} with no samples")
    if samples.shape[0] < info.frames:
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"truncated: {samples.shape[0]:,} of the {info.frames:,} frames its header announces",
        )
    bad = ~np.isfinite(samples)
    if bad.any():
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"{int(bad.sum()):,} NaN or infinite sample(s), the first at frame "
            f"{int(np.argwhere(bad)[0][0]):,}",
        )
    return Audio(info=info, samples=samples)


def _said(exc: Exception) -> str:
    # libsndfile names the stream object ("Error opening <_io.BytesIO …>: …"): its reason only.
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("Error opening") and ": " in text else text


def _announced_bytes(data: bytes) -> int | None:
    """The length a RIFF (WAV) or FORM (AIFF) file's header gives itself:
    libsndfile reads a cut WAV as a shorter one without a word."""
    size = None
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        size = struct.unpack("<I", data[4:8])[0]
    elif len(data) >= 12 and data[:4] == b"FORM" and data[8:12] in (b"AIFF", b"AIFC"):
        size = struct.unpack(">I", data[4:8])[0]
    # A writer that streamed the file may leave its length unknown (0, or all ones).
    if size is None or size in (0, 0xFFFFFFFF):
        return None
    return 8 + size
