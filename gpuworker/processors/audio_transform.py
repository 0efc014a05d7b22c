"""Audio transformation (CPU): resample with soxr, mix to mono, trim or pad,
normalise loudness, encode as WAV, FLAC or OGG/Vorbis with libsndfile.

Each input is decoded and transformed when it is read, in the runner's
reader threads (several at once: soxr and libsndfile let go of the GIL), and
only its output kept until written: a batch holds its outputs' samples,
float32, `batch_size` × seconds × rate × channels × 4 bytes (16 clips of 10 s
at 16 kHz mono: 10 MiB). Every output is decoded back from its file before it
counts, with exactly the rate, channels and length its input gives
(campaigns.specs.audio.check_audio_output).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

from campaigns.intake.audio import AudioInfo, audio_info, decode_audio
from campaigns.intake.inputs import InputError
from campaigns.models import ErrorClass
from campaigns.review.flags import audio_flags
from campaigns.specs.audio import (
    AUDIO_FORMATS,
    check_audio_output,
    encode_audio,
    output_channels,
    output_rate,
    output_refusal,
)
from campaigns.storage.outputs import InvalidOutput
from gpuworker.memory import MemoryProbe, cpu
from gpuworker.processors.image_transform import SourceSizes

#: A sample at or above this is at full scale (clipped).
FULL_SCALE = 0.9999


@dataclass(eq=False)
class Made:
    """One input's output, made as the input was read."""

    source: AudioInfo
    samples: np.ndarray  # (frames, channels) float32
    rate: int
    peak_dbfs: float  # the input's
    clipped_share: float  # the input's samples at full scale
    gain_db: float  # what the loudness step applied
    limited: bool  # an RMS gain lowered so the output does not clip
    seconds: float  # decoding and transforming it


@dataclass
class AudioBatch:
    items: list[Made]
    seconds: float
    memory: dict


def _dbfs(value: float) -> float:
    """A level in dB relative to full scale; silence is -200 (JSON has no -inf)."""
    return max(-200.0, 20 * float(np.log10(value))) if value > 0 else -200.0


class AudioTransformProcessor:
    def __init__(self, params: dict):
        self.params = params
        self.suffix = AUDIO_FORMATS[params["format"]][2]
        self.probe = MemoryProbe(cpu())
        self.sources: SourceSizes[AudioInfo] = SourceSizes()

    def prepare(self, data: bytes) -> Made:
        started = time.perf_counter()
        params = self.params
        name = getattr(data, "name", "")
        info = audio_info(data, float(params["max_seconds"]), int(params["max_samples"]), name=name)
        # Refused from the header, before it is decoded: what the format cannot hold.
        refusal = output_refusal(info, params)
        if refusal:
            raise InputError(ErrorClass.INPUT_INVALID, refusal)
        audio = decode_audio(data, name=name)
        made = self.transform(audio.samples, audio.info)
        if made.samples.shape[0] == 0:
            raise InputError(
                ErrorClass.INPUT_INVALID,
                f"too short: {info.frames} frame(s) at {info.rate:,} Hz make none at {made.rate:,}",
            )
        made.seconds = time.perf_counter() - started
        return made

    def transform(self, samples: np.ndarray, info: AudioInfo) -> Made:
        params = self.params
        peak = max(float(samples.max()), -float(samples.min()))
        full = np.count_nonzero(samples >= FULL_SCALE) + np.count_nonzero(samples <= -FULL_SCALE)
        clipped = full / samples.size
        if params["channels"] == "mono" and samples.shape[1] > 1:
            samples = samples.mean(axis=1, keepdims=True, dtype=np.float32)
        rate = output_rate(info, params)
        if rate != info.rate:
            samples = soxr.resample(samples, info.rate, rate, quality="HQ")
        samples = self._length(np.ascontiguousarray(samples, dtype=np.float32), rate)
        gain, limited = self._gain(samples)
        if gain != 1.0:
            samples = samples * np.float32(gain)
        return Made(
            source=info,
            samples=np.clip(samples, -1.0, 1.0, out=samples),
            rate=rate,
            peak_dbfs=round(_dbfs(peak), 2),
            clipped_share=clipped,
            gain_db=round(_dbfs(gain), 2),
            limited=limited,
            seconds=0.0,
        )

    def _length(self, samples: np.ndarray, rate: int) -> np.ndarray:
        length = self.params["length"]
        if length == "keep":
            return samples
        frames = round(float(self.params["seconds"]) * rate)
        if length in ("trim", "exact") and samples.shape[0] > frames:
            # A copy: a view would keep the whole decoded input until the output is written.
            samples = samples[:frames].copy()
        if length in ("pad", "exact") and samples.shape[0] < frames:
            pad = np.zeros((frames - samples.shape[0], samples.shape[1]), dtype=np.float32)
            samples = np.concatenate([samples, pad])
        return samples

    def _gain(self, samples: np.ndarray) -> tuple[float, bool]:
        """The loudness step's gain, and whether it was lowered to keep the peak at full scale."""
        loudness = self.params["loudness"]
        peak = max(float(samples.max()), -float(samples.min())) if samples.size else 0.0
        if loudness == "none" or peak == 0:
            return 1.0, False
        target = 10 ** (float(self.params["target_dbfs"]) / 20)
        if loudness == "peak":
            return target / peak, False
        rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
        gain = target / rms
        if gain * peak > 1.0:
            return 1.0 / peak, True
        return gain, False

    def run(self, items: list[Made]) -> AudioBatch:
        # The work was done as each input was read: a batch gathers its outputs.
        return AudioBatch(
            items=items, seconds=sum(item.seconds for item in items), memory=self.probe.snapshot()
        )

    def output(self, result: AudioBatch, index: int) -> Made:
        return result.items[index]

    def serialize(self, made: Made) -> bytes:
        data = encode_audio(made.samples, made.rate, self.params)
        self.sources.remember(hashlib.sha256(data).hexdigest(), made.source)
        return data

    def validate(self, path: Path) -> None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidOutput(f"unreadable: {exc}") from exc
        check_audio_output(data, self.params, self.sources.of(path))

    def unit_metrics(self, result: AudioBatch, index: int) -> dict:
        made = result.items[index]
        return {
            "input_format": f"{made.source.format}/{made.source.subtype}",
            "input_rate": made.source.rate,
            "input_channels": made.source.channels,
            "input_seconds": round(made.source.seconds, 4),
            "output_rate": made.rate,
            "output_channels": output_channels(made.source, self.params),
            "output_seconds": round(made.samples.shape[0] / made.rate, 4),
            "peak_dbfs": made.peak_dbfs,
            "gain_db": made.gain_db,
            **({"gain_limited": True} if made.limited else {}),
            **({"named_as": made.source.named_as} if made.source.named_as else {}),
        }

    def flags(self, result: AudioBatch, index: int) -> list[tuple[str, str]]:
        made = result.items[index]
        return audio_flags(made.peak_dbfs, made.clipped_share, made.source, self.params)

    def batch_metrics(self, result: AudioBatch) -> dict:
        # Milliseconds of input audio in the token columns: what the batch weighed.
        ms = sum(round(item.source.seconds * 1000) for item in result.items)
        return {
            "real_tokens": ms,
            "padded_tokens": ms,
            "compute_seconds": round(result.seconds, 4),
            "memory": result.memory,
        }
