"""Audio inputs decoded with libsndfile (the `soundfile` package): WAV, FLAC,
OGG/Vorbis, MP3, AIFF and the other formats it reads, told apart by their
content, never by their name (a name that says another format is recorded:
`named_as`).

Every decoded fact is kept (`AudioInfo`: sample rate, channels, frames,
seconds, format) and every bad input fails with a classified, readable reason
before anything is made from it: an empty file, bytes that are no audio (a
text file named `.wav`), a file cut short, a file longer than `max_seconds`
or holding more than `max_samples` samples (refused from its header, before
it is decoded), a length its header does not say, no samples, NaN or
infinite samples. Torch-free: the web process's previews and checks use it.

Cut files: libsndfile reads a cut WAV or AIFF as a shorter one without a
word, and a cut OGG/Vorbis too, so their own framing is checked: the WAV's
`data` chunk (an RF64's `ds64` size) or the AIFF's `SSND` chunk must end
within the file, and an Ogg stream's last page must carry its end-of-stream
mark. A cut FLAC loses its decoder's sync. An MP3's length is the one its
Xing/Info/VBRI header gives; without one, libsndfile guesses it from the
bitrate and may stop early on a variable bitrate, so such a file is refused.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import PurePosixPath

import numpy as np
import soundfile

from campaigns.intake.inputs import InputError
from campaigns.models import ErrorClass

#: Longest input by default: a corpus of clips, not of recordings.
MAX_SECONDS = 600
#: Most samples (frames × channels) an input may decode to by default: 600 s
#: of 48 kHz stereo, 230 MB as float32.
MAX_SAMPLES = 57_600_000
#: libsndfile's frame count when a header does not say (a streamed FLAC).
_UNKNOWN_FRAMES = 1 << 62
#: An MP3 frame: the decoder's count may fall short of the header's by a frame or two.
MP3_FRAME = 1152
#: What each format's files are named, to record a name that says another.
SUFFIXES = {
    "WAV": (".wav", ".wave"),
    "RF64": (".wav", ".rf64"),
    "W64": (".w64", ".wav"),
    "FLAC": (".flac",),
    "OGG": (".ogg", ".oga", ".opus"),
    "MP3": (".mp3",),
    "AIFF": (".aif", ".aiff", ".aifc"),
}
#: The media type a browser plays each format as.
MEDIA_TYPES = {
    "WAV": "audio/wav",
    "RF64": "audio/wav",
    "FLAC": "audio/flac",
    "OGG": "audio/ogg",
    "MP3": "audio/mpeg",
    "AIFF": "audio/aiff",
}


@dataclass(frozen=True)
class AudioInfo:
    """What an audio file's header says."""

    rate: int
    channels: int
    frames: int
    format: str  # libsndfile's: WAV, FLAC, OGG, MP3…
    subtype: str
    named_as: str = ""  # the format its name says, when not this one (".wav" holding FLAC)

    @property
    def seconds(self) -> float:
        return self.frames / self.rate if self.rate else 0.0


@dataclass(frozen=True)
class Audio:
    info: AudioInfo
    samples: np.ndarray  # (frames, channels) float32 in [-1, 1] as decoded


def audio_info(
    data: bytes,
    max_seconds: float = 0,
    max_samples: int = 0,
    *,
    whole: bool = True,
    name: str = "",
) -> AudioInfo:
    """The header's facts, or InputError: no audio, cut short, a length it
    does not say, over max_seconds or max_samples. `whole`: `data` is the
    whole file (its framing is checked); False for a header read alone.
    `name`: the file's name, to record one that says another format."""
    if not data:
        raise InputError(ErrorClass.INPUT_INVALID, "empty file")
    try:
        found = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, ValueError) as exc:
        said = _said(exc)
        # A format libsndfile knows, cut or damaged inside its header.
        what = "truncated or damaged" if "malformed" in said else "not audio libsndfile reads"
        raise InputError(ErrorClass.INPUT_INVALID, f"{what} ({said})") from None
    fmt = str(found.format)
    info = AudioInfo(
        rate=int(found.samplerate),
        channels=int(found.channels),
        frames=int(found.frames),
        format=fmt,
        subtype=str(found.subtype),
        named_as=_named_as(name, fmt),
    )
    if info.rate <= 0 or info.channels <= 0:
        raise InputError(ErrorClass.INPUT_INVALID, f"{fmt} with no sample rate or channel")
    if info.frames >= _UNKNOWN_FRAMES:
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"a {fmt} whose header does not say its length (written as a stream): "
            "re-encode it, e.g. `ffmpeg -i in.flac out.flac`",
        )
    if whole:
        _check_whole(data, fmt)
    if max_seconds and info.seconds > max_seconds:
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"{info.seconds:,.1f} s of audio, over max_seconds {max_seconds:g}",
        )
    if max_samples and info.frames * info.channels > max_samples:
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"{info.frames * info.channels:,} samples ({info.channels} channels × "
            f"{info.frames:,} frames), over max_samples {max_samples:,}",
        )
    return info


def decode_audio(
    data: bytes, max_seconds: float = 0, max_samples: int = 0, name: str = ""
) -> Audio:
    """The whole file's samples, float32 (frames, channels), with its facts."""
    info = audio_info(data, max_seconds, max_samples, name=name)
    try:
        samples, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, ValueError) as exc:
        raise InputError(ErrorClass.INPUT_INVALID, f"truncated or damaged ({_said(exc)})") from None
    short = info.frames - samples.shape[0]
    if samples.shape[0] == 0 or short > (2 * MP3_FRAME if info.format == "MP3" else 0):
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"truncated: {samples.shape[0]:,} of the {info.frames:,} frames its header announces",
        )
    if short > 0:  # an MP3's count, a frame or two over what it decodes to
        info = AudioInfo(**{**info.__dict__, "frames": samples.shape[0]})
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


def _named_as(name: str, fmt: str) -> str:
    suffix = PurePosixPath(name.split("#", 1)[0]).suffix.lower()
    if not suffix or suffix in SUFFIXES.get(fmt, ()):
        return ""
    known = [f for f, suffixes in SUFFIXES.items() if suffix in suffixes]
    return known[0] if known else ""


def _truncated(has: int, wants: int, fmt: str) -> InputError:
    return InputError(
        ErrorClass.INPUT_INVALID,
        f"truncated: {has:,} of the {wants:,} bytes its {fmt} header announces",
    )


def _check_whole(data: bytes, fmt: str) -> None:
    """The file holds what its own framing announces (the module's docstring)."""
    if fmt in ("WAV", "RF64", "AIFF"):
        end = _sound_data_end(data)
        # A data chunk of odd size may miss its pad byte: every sample is there.
        if end is not None and end > len(data):
            raise _truncated(len(data), end, fmt)
    elif fmt == "OGG":
        last = data.rfind(b"OggS", max(0, len(data) - 65536))
        if last < 0 or len(data) < last + 27 or not data[last + 5] & 0x04:
            raise InputError(
                ErrorClass.INPUT_INVALID,
                "truncated: its Ogg stream ends without its end-of-stream page",
            )
    elif fmt == "MP3" and not any(tag in data[:65536] for tag in (b"Xing", b"Info", b"VBRI")):
        raise InputError(
            ErrorClass.INPUT_INVALID,
            "an MP3 without a Xing, Info or VBRI header: its length is only guessed from its "
            "bitrate, and a variable bitrate would be cut short; re-encode it, e.g. "
            "`ffmpeg -i in.mp3 out.flac`",
        )


def _sound_data_end(data: bytes) -> int | None:
    """Where a WAV's `data` chunk (an RF64's, by its ds64 size) or an AIFF's
    `SSND` chunk ends by its size; None when the file does not say (a
    streamed writer's 0 or all-ones sizes)."""
    if data[:4] in (b"RIFF", b"RF64") and data[8:12] == b"WAVE":
        little, wanted = True, b"data"
    elif data[:4] == b"FORM" and data[8:12] in (b"AIFF", b"AIFC"):
        little, wanted = False, b"SSND"
    else:
        return None
    rf64_data = None
    if data[:4] == b"RF64" and data[12:16] == b"ds64" and len(data) >= 36:
        rf64_data = struct.unpack("<Q", data[28:36])[0]
    at = 12
    while at + 8 <= len(data):
        chunk = data[at : at + 4]
        size = struct.unpack("<I" if little else ">I", data[at + 4 : at + 8])[0]
        if chunk == wanted:
            if rf64_data is not None and size == 0xFFFFFFFF:
                size = rf64_data
            if size in (0, 0xFFFFFFFF):
                return None
            return at + 8 + size
        at += 8 + size + (size & 1)
    return None
