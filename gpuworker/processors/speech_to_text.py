"""Speech to text with a local Whisper-style model (AutoModelForSpeechSeq2Seq
and its processor), greedy decoding.

Each file is decoded, mixed to mono and resampled to the feature extractor's
rate when it is read (campaigns/intake/audio.py, soxr). A batch's files of
one window (30 s) at most are transcribed together; a longer file alone,
by Whisper's own long-form transcription (transformers' `generate` with the
whole file's features, `return_segments`): a 30 s window at a time, each
window starting at the end of the last whole segment of the one before, so
the windows overlap where a segment was cut and no word is lost or written
twice at a cut. Without a `language`, each file's is detected on its first
30 s (`detect_language`) and the whole file transcribed in it.
"""

from __future__ import annotations

import functools
import json
import math
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
from campaigns.specs.speech import WINDOW_SECONDS, read_transcript
from gpuworker.memory import MemoryProbe, device_and_dtype
from gpuworker.processors.text_embedding import folder_stamp


@dataclass(eq=False)
class Clip:
    """One file, decoded: mono float32 at the feature extractor's rate."""

    info: AudioInfo
    samples: np.ndarray
    seconds: float


@dataclass
class Transcript:
    text: str
    language: str
    task: str
    seconds: float
    segments: list[dict] = field(default_factory=list)
    tokens: int = 0
    windows: int = 0  # the 30 s windows the model read at least


@dataclass
class SpeechBatch:
    transcripts: list[Transcript]
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
        config = self.model.generation_config
        # An English-only model (a `.en` folder) takes no language or task.
        self.multilingual = bool(getattr(config, "is_multilingual", False))
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
        return Clip(info=audio.info, samples=samples, seconds=len(samples) / self.rate)

    def run(self, items: list[Clip]) -> SpeechBatch:
        started = time.perf_counter()
        self.probe.reset_peak()
        languages = self._languages(items)
        segments = self._generate(items, languages)
        transcripts = [
            self._transcript(clip, found, language)
            for clip, found, language in zip(items, segments, languages, strict=True)
        ]
        return SpeechBatch(
            transcripts=transcripts,
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
            "windows": done.windows,
            "segments": len(done.segments),
            "tokens": done.tokens,
        }

    def flags(self, result: SpeechBatch, index: int) -> list[tuple[str, str]]:
        return transcript_flags(result.transcripts[index].text, self.params)

    def batch_metrics(self, result: SpeechBatch) -> dict:
        ms = sum(round(t.seconds * 1000) for t in result.transcripts)
        return {
            "real_tokens": ms,
            # Each file is read in 30 s windows, the last one padded.
            "padded_tokens": sum(t.windows for t in result.transcripts) * WINDOW_SECONDS * 1000,
            "compute_seconds": round(result.seconds, 4),
            "generated_tokens": sum(t.tokens for t in result.transcripts),
            "memory": result.memory,
        }

    # --- the model ----------------------------------------------------------

    def _features(self, arrays: list[np.ndarray], whole: bool) -> dict:
        """Log-mel features: the first 30 s of each (`whole` False), or each file
        whole, padded to the longest with its attention mask (long-form)."""
        extractor = self.processor.feature_extractor
        if whole:
            # A batch of files within one window is padded to the window
            # (short-form), a longer one to its longest file (long-form).
            longest = max(len(a) for a in arrays) > WINDOW_SECONDS * self.rate
            made = extractor(
                arrays,
                sampling_rate=self.rate,
                return_tensors="pt",
                truncation=False,
                padding="longest" if longest else "max_length",
                return_attention_mask=True,
            )
            return {
                "input_features": made.input_features.to(self.device, self.dtype),
                "attention_mask": made.attention_mask.to(self.device),
            }
        made = extractor(arrays, sampling_rate=self.rate, return_tensors="pt")
        return {"input_features": made.input_features.to(self.device, self.dtype)}

    @torch.inference_mode()
    def _languages(self, items: list[Clip]) -> list[str]:
        """Each file's language: the version's, "en" for an English-only
        model, or detected on the file's first 30 s."""
        if not self.multilingual:
            return ["en"] * len(items)
        if self.params["language"] or not self.codes:
            return [self.params["language"]] * len(items)
        first = [c.samples[: WINDOW_SECONDS * self.rate] for c in items]
        found = self.model.detect_language(self._features(first, whole=False)["input_features"])
        return [self.codes.get(int(token), "") for token in found.tolist()]

    @torch.inference_mode()
    def _generate(self, items: list[Clip], languages: list[str]) -> list[list[dict]]:
        """Each file's segments, as Whisper gives them: the files within one
        window together (short-form, each padded to the window), a longer
        file alone (long-form). A file read with others of other lengths
        would be read by the other method, and its text would depend on its
        batch; this way a resumed unit writes the same text in any batch."""
        found: list[list[dict]] = [[] for _ in items]
        window = WINDOW_SECONDS * self.rate
        short = [i for i, clip in enumerate(items) if len(clip.samples) <= window]
        groups = [short] if short else []
        groups += [[i] for i, clip in enumerate(items) if len(clip.samples) > window]
        for group in groups:
            options: dict = {}
            if self.multilingual:
                options["task"] = self.params["task"]
                if any(languages[i] for i in group):
                    options["language"] = [languages[i] for i in group]
            out = self.model.generate(
                **self._features([items[i].samples for i in group], whole=True),
                return_timestamps=True,
                return_segments=True,
                max_new_tokens=int(self.params["max_new_tokens"]),
                do_sample=False,
                num_beams=1,
                **options,
            )
            for i, segments in zip(group, out["segments"], strict=True):
                found[i] = list(segments)
        return found

    def _transcript(self, clip: Clip, found: list[dict], language: str) -> Transcript:
        """The file's segments, in order, their times within the audio (a
        model may place a last segment past the end), their tokens decoded."""
        tokenizer = self.processor.tokenizer
        end = round(clip.seconds, 3)
        segments, tokens = [], 0
        for segment in found:
            ids = [int(t) for t in segment["tokens"]]
            tokens += len(ids)
            text = tokenizer.decode(ids, skip_special_tokens=True).strip()
            if not text:
                continue
            stop = min(round(float(segment["end"]), 3), end)
            start = min(round(float(segment["start"]), 3), stop)
            segments.append({"start": max(0.0, start), "end": max(0.0, stop), "text": text})
        segments.sort(key=lambda s: (s["start"], s["end"]))
        return Transcript(
            text=" ".join(s["text"] for s in segments),
            language=language,
            task=self.params["task"] if self.multilingual else "transcribe",
            seconds=clip.seconds,
            segments=segments,
            tokens=tokens,
            windows=max(1, math.ceil(clip.seconds / WINDOW_SECONDS)),
        )
