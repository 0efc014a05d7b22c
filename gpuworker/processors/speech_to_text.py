"""Speech to text with a local Whisper-style model (AutoModelForSpeechSeq2Seq
and its processor), greedy decoding.

Each file is decoded, mixed to mono and resampled to the feature extractor's
rate when it is read (campaigns/intake/audio.py, soxr), and cut into chunks
of `chunk_seconds` that overlap by `overlap_seconds`. A batch's chunks go
through the model `chunk_batch` at a time, each padded to the model's 30 s
window as Whisper expects; without a `language`, each file's is detected on
its first chunk (`detect_language`) and its chunks transcribed in it. A
chunk's tokens are read into segments by its timestamp tokens; a file keeps
each chunk's segments up to the middle of its overlap with the next.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soxr
import torch
from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

from campaigns.intake.audio import AudioInfo, decode_audio
from campaigns.review.flags import transcript_flags
from campaigns.specs.builtin import resolve_model_path
from campaigns.specs.speech import read_transcript
from gpuworker.memory import MemoryProbe, device_and_dtype
from gpuworker.processors.text_embedding import folder_stamp

#: Seconds a Whisper timestamp token counts.
STAMP_SECONDS = 0.02


@dataclass(eq=False)
class Clip:
    """One file, decoded and cut into chunks."""

    info: AudioInfo
    chunks: list[np.ndarray]  # mono float32 at the feature extractor's rate
    starts: list[float]  # each chunk's start, seconds
    seconds: float


@dataclass
class Transcript:
    text: str
    language: str
    task: str
    seconds: float
    segments: list[dict] = field(default_factory=list)
    tokens: int = 0
    chunks: int = 0


@dataclass
class SpeechBatch:
    transcripts: list[Transcript]
    chunks: int
    seconds: float
    memory: dict


@functools.lru_cache(maxsize=2)
def load_speech(path: str, _stamp: tuple, device: torch.device, dtype: torch.dtype):
    """(processor, model) of a folder, once per worker process, folder contents and precision."""
    folder = Path(path)
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSpeechSeq2Seq.from_pretrained(folder, local_files_only=True, dtype=dtype)
    return processor, model.to(device).eval()


class SpeechToTextProcessor:
    suffix = ".json"

    def __init__(self, params: dict):
        self.params = params
        self.device, self.dtype = device_and_dtype(params["dtype"])
        folder = resolve_model_path(params["model"])
        self.processor, self.model = load_speech(
            str(folder), folder_stamp(folder), self.device, self.dtype
        )
        extractor = self.processor.feature_extractor
        self.rate = int(extractor.sampling_rate)
        self.window = float(getattr(extractor, "chunk_length", 30))
        self.chunk = min(float(params["chunk_seconds"]), self.window)
        self.stamped = params["timestamps"] == "yes"
        # Without times, overlapping chunks could not be joined without
        # doubling their shared words: chunks then follow each other.
        self.overlap = float(params["overlap_seconds"]) if self.stamped else 0.0
        tokenizer = self.processor.tokenizer
        self.stamp_zero = tokenizer.convert_tokens_to_ids("<|0.00|>")
        self.specials = set(tokenizer.all_special_ids)
        self.codes = {v: str(k).strip("<|>") for k, v in self._lang_to_id().items()}
        self.probe = MemoryProbe(self.device)

    def _lang_to_id(self) -> dict:
        return dict(getattr(self.model.generation_config, "lang_to_id", None) or {})

    # --- the interface the batch runner uses ------------------------------

    def prepare(self, data: bytes) -> Clip:
        audio = decode_audio(
            data,
            float(self.params["max_seconds"]),
            int(self.params["max_samples"]),
            getattr(data, "name", ""),
        )
        samples = audio.samples.mean(axis=1, dtype=np.float32)
        if audio.info.rate != self.rate:
            samples = soxr.resample(samples, audio.info.rate, self.rate, quality="HQ")
        seconds = len(samples) / self.rate
        step = self.chunk - self.overlap
        starts = [0.0]
        while starts[-1] + self.chunk < seconds:
            starts.append(round(starts[-1] + step, 6))
        size = round(self.chunk * self.rate)
        chunks = [
            np.ascontiguousarray(samples[round(s * self.rate) : round(s * self.rate) + size])
            for s in starts
        ]
        return Clip(info=audio.info, chunks=chunks, starts=starts, seconds=seconds)

    def run(self, items: list[Clip]) -> SpeechBatch:
        started = time.perf_counter()
        self.probe.reset_peak()
        pieces = [(i, k) for i, clip in enumerate(items) for k in range(len(clip.chunks))]
        languages = self._languages(items)
        decoded: dict[tuple[int, int], list[int]] = {}
        step = int(self.params["chunk_batch"])
        for at in range(0, len(pieces), step):
            part = pieces[at : at + step]
            tokens = self._generate(
                [items[i].chunks[k] for i, k in part], [languages[i] for i, _ in part]
            )
            decoded.update(zip(part, tokens, strict=True))
        transcripts = [
            self._transcript(clip, [decoded[(i, k)] for k in range(len(clip.chunks))], languages[i])
            for i, clip in enumerate(items)
        ]
        return SpeechBatch(
            transcripts=transcripts,
            chunks=len(pieces),
            seconds=time.perf_counter() - started,
            memory=self.probe.snapshot(),
        )

    def output(self, result: SpeechBatch, index: int) -> Transcript:
        return result.transcripts[index]

    def serialize(self, transcript: Transcript) -> bytes:
        return json.dumps(
            {
                "text": transcript.text,
                "language": transcript.language,
                "task": transcript.task,
                "seconds": round(transcript.seconds, 3),
                "segments": transcript.segments,
            },
            ensure_ascii=False,
        ).encode("utf-8")

    def validate(self, path: Path) -> None:
        read_transcript(path, self.params)

    def unit_metrics(self, result: SpeechBatch, index: int) -> dict:
        done = result.transcripts[index]
        return {
            "language": done.language,
            "seconds": round(done.seconds, 3),
            "chunks": done.chunks,
            "segments": len(done.segments),
            "tokens": done.tokens,
        }

    def flags(self, result: SpeechBatch, index: int) -> list[tuple[str, str]]:
        return transcript_flags(result.transcripts[index].text, self.params)

    def batch_metrics(self, result: SpeechBatch) -> dict:
        ms = sum(round(t.seconds * 1000) for t in result.transcripts)
        return {
            "real_tokens": ms,
            # Each chunk is padded to the model's window.
            "padded_tokens": round(result.chunks * self.window * 1000),
            "compute_seconds": round(result.seconds, 4),
            "generated_tokens": sum(t.tokens for t in result.transcripts),
            "memory": result.memory,
        }

    # --- the model ----------------------------------------------------------

    def _features(self, chunks: list[np.ndarray]) -> torch.Tensor:
        features = self.processor.feature_extractor(
            chunks, sampling_rate=self.rate, return_tensors="pt"
        ).input_features
        return features.to(self.device, self.dtype)

    @torch.inference_mode()
    def _languages(self, items: list[Clip]) -> list[str]:
        """Each file's language: the version's, or detected on its first chunk."""
        if self.params["language"] or not self.codes:
            return [self.params["language"]] * len(items)
        found = self.model.detect_language(self._features([c.chunks[0] for c in items]))
        return [self.codes.get(int(token), "") for token in found.tolist()]

    @torch.inference_mode()
    def _generate(self, chunks: list[np.ndarray], languages: list[str]) -> list[list[int]]:
        options: dict = {"task": self.params["task"]}
        if any(languages):
            options["language"] = languages
        out = self.model.generate(
            self._features(chunks),
            return_timestamps=self.stamped,
            max_new_tokens=int(self.params["max_new_tokens"]),
            do_sample=False,
            num_beams=1,
            **options,
        )
        sequences = out if isinstance(out, torch.Tensor) else out["sequences"]
        return sequences.cpu().tolist()

    def _segments(self, tokens: list[int], start: float, length: float) -> list[dict]:
        """A chunk's segments by its timestamp tokens, in the file's seconds."""
        segments: list[dict] = []
        opened: float | None = None
        words: list[int] = []

        def close(end: float) -> None:
            text = self.processor.tokenizer.decode(words, skip_special_tokens=True).strip()
            begin = min(opened if opened is not None else 0.0, end)
            if text:
                segments.append(
                    {"start": round(start + begin, 3), "end": round(start + end, 3), "text": text}
                )
            words.clear()

        for token in tokens:
            if token >= self.stamp_zero and not self.stamped:
                continue  # times not asked for: the chunk is one segment
            if token >= self.stamp_zero:
                stamp = min((token - self.stamp_zero) * STAMP_SECONDS, length)
                if opened is None:
                    opened = stamp
                else:
                    close(max(stamp, opened))
                    opened = None
            elif token not in self.specials:
                words.append(token)
        if words:
            close(length)
        return segments

    def _transcript(self, clip: Clip, chunks: list[list[int]], language: str) -> Transcript:
        kept: list[dict] = []
        for k, tokens in enumerate(chunks):
            begin = clip.starts[k]
            length = min(self.chunk, clip.seconds - begin)
            # A segment belongs to the chunk whose share of the overlap holds its start.
            low = begin + self.overlap / 2 if k else 0.0
            high = clip.starts[k + 1] + self.overlap / 2 if k + 1 < len(chunks) else clip.seconds
            for segment in self._segments(tokens, begin, length):
                if low <= segment["start"] < high:
                    kept.append(segment)
        kept.sort(key=lambda s: (s["start"], s["end"]))
        for segment in kept:  # a chunk's last stamp may pass the file's end a little
            segment["end"] = min(segment["end"], round(clip.seconds, 3))
            segment["start"] = min(segment["start"], segment["end"])
        return Transcript(
            text=" ".join(s["text"] for s in kept),
            language=language,
            task=self.params["task"],
            seconds=clip.seconds,
            segments=kept,
            tokens=sum(len(t) for t in chunks),
            chunks=len(chunks),
        )
