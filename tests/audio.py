"""Audio made by a test: tones and noise written with libsndfile, and the
bad inputs a corpus of clips holds (empty, cut short, not audio, too long,
NaN samples)."""

from __future__ import annotations

import io

import numpy as np
import soundfile


def tone(
    seconds: float = 1.0,
    rate: int = 16000,
    channels: int = 1,
    freq: float = 440.0,
    amplitude: float = 0.5,
) -> np.ndarray:
    """A sine of `freq` Hz, (frames, channels) float32; each channel a little apart."""
    t = np.arange(round(seconds * rate)) / rate
    columns = [amplitude * np.sin(2 * np.pi * (freq + 110 * c) * t) for c in range(channels)]
    return np.stack(columns, axis=1).astype(np.float32)


def noise(seconds: float = 1.0, rate: int = 16000, channels: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (0.2 * rng.standard_normal((round(seconds * rate), channels))).astype(np.float32)


def encoded(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def bad_clips() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, what the refusal says)."""
    wav = encoded(tone(1.0), 16000, "WAV", "PCM_16")
    flac = encoded(tone(1.0), 16000, "FLAC")
    nan = tone(0.5)
    nan[100] = np.nan
    return {
        "empty.wav": (b"", "empty file"),
        "notes.wav": (b"these are meeting notes, not a recording\n", "not audio"),
        "cut.wav": (wav[: len(wav) // 2], "truncated"),
        "cut.flac": (flac[: len(flac) // 2], "truncated or damaged"),
        "nan.wav": (encoded(nan, 16000, "WAV", "FLOAT"), "NaN or infinite"),
        "hour.wav": (encoded(tone(3.0, rate=8000), 8000, "WAV", "PCM_16"), "over max_seconds"),
    }
