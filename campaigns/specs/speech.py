"""Speech to text with a local Whisper-style model folder — the spec side,
without torch (the worker side is gpuworker/processors/speech_to_text.py;
docs/processors.md, "Built-in: speech-to-text").

A unit is an audio file (decoded as the audio transform decodes it,
campaigns/intake/audio.py). The model reads it in 30 s windows, the last one
padded: a unit's cost is its windows' milliseconds, so a 2 s clip weighs
what a 30 s one does, as it costs the model. A long file is transcribed by
Whisper's long-form method, each window starting where the last whole
segment of the one before ended (the worker's docstring). The output is one
JSON object: the text, the language, the task, the seconds and the segments
with their times.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from django.core.exceptions import ValidationError

from campaigns.intake.audio import MAX_SAMPLES, Audio, decode_audio
from campaigns.review.flags import REPEAT_FLAGS
from campaigns.specs.audio import audio_cost
from campaigns.specs.builtin import model_config
from campaigns.specs.limits import IMAGE_MAX_INPUT_BYTES, input_read_limits
from campaigns.specs.processors import ParamSpec, ProcessorSpec
from campaigns.storage.outputs import (
    WRONG_OUTPUT,
    InvalidOutput,
    check_json_output_head,
    read_json_output,
)

#: Seconds of audio the model reads at once (Whisper's window).
WINDOW_SECONDS = 30
#: The fields of every output, in this order.
OUTPUT_FIELDS = ("text", "language", "task", "seconds", "segments")
#: A segment's times may pass the audio's end by this much (rounding).
TIME_SLACK = 0.05
#: Bytes an output may hold a second of audio (words, times, JSON), with room.
OUTPUT_BYTES_PER_SECOND = 4096


def check_transcript(record: object, params: dict) -> dict:
    """One output's JSON object as the worker writes it, or InvalidOutput."""
    if not isinstance(record, dict) or tuple(record) != OUTPUT_FIELDS:
        got = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise InvalidOutput(f"fields {got}, expected {', '.join(OUTPUT_FIELDS)}", WRONG_OUTPUT)
    if not isinstance(record["text"], str) or not isinstance(record["language"], str):
        raise InvalidOutput("text and language must be text", WRONG_OUTPUT)
    if record["task"] != params["task"]:
        raise InvalidOutput(f"task {record['task']!r}, asked {params['task']!r}", WRONG_OUTPUT)
    if params["language"] and record["language"] != params["language"]:
        raise InvalidOutput(
            f"language {record['language']!r}, asked {params['language']!r}", WRONG_OUTPUT
        )
    seconds = record["seconds"]
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
        raise InvalidOutput(f"seconds {seconds!r}", WRONG_OUTPUT)
    segments = record["segments"]
    if not isinstance(segments, list):
        raise InvalidOutput("segments must be a list", WRONG_OUTPUT)
    last = 0.0
    for at, segment in enumerate(segments):
        if (
            not isinstance(segment, dict)
            or set(segment) != {"start", "end", "text"}
            or not isinstance(segment["text"], str)
            or not all(isinstance(segment[k], int | float) for k in ("start", "end"))
        ):
            raise InvalidOutput(f"segment {at} is not start, end and text", WRONG_OUTPUT)
        start, end = segment["start"], segment["end"]
        if not last - TIME_SLACK <= start <= end <= seconds + TIME_SLACK:
            raise InvalidOutput(
                f"segment {at} at {start}–{end} s, out of order or past the audio's {seconds} s",
                WRONG_OUTPUT,
            )
        last = start
    return record


def read_transcript(path: Path, params: dict) -> dict:
    """An output file read (bounded by what max_seconds can make) and checked."""
    longest = int(float(params["max_seconds"]) * OUTPUT_BYTES_PER_SECOND) + 65536
    return check_transcript(read_json_output(path, longest, "transcript"), params)


def _quick_check(path: Path, expected_size: int | None, params: dict) -> None:
    check_json_output_head(path, expected_size)


def _deep_check(path: Path, params: dict) -> None:
    read_transcript(path, params)


def speech_cost(path: Path, params: dict) -> int | None:
    """The milliseconds of the 30 s windows the model reads the file in,
    from its header alone (None for a length the header does not say)."""
    ms = audio_cost(path, params)
    if ms is None:
        return None
    return max(1, math.ceil(ms / (WINDOW_SECONDS * 1000))) * WINDOW_SECONDS * 1000


def _check_input(data: bytes, params: dict) -> Audio:
    return decode_audio(
        data, float(params["max_seconds"]), int(params["max_samples"]), getattr(data, "name", "")
    )


def languages_of(generation: object) -> list[str] | None:
    """The languages a generation config names ("en", "fr"…), None if it names none."""
    codes = generation.get("lang_to_id") if isinstance(generation, dict) else None
    if not isinstance(codes, dict):
        return None
    return sorted(str(code).strip("<|>") for code in codes)


def validate_speech(params: dict) -> None:
    """A Whisper-style folder with its feature extractor; a language it knows."""
    found = model_config(params)
    if found is None:
        return
    folder, config = found
    if not isinstance(config, dict) or config.get("model_type") != "whisper":
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise ValidationError(
            f"model: {folder} is a {kind or 'model of no type'}, not a Whisper-style "
            "speech model (model_type whisper: AutoModelForSpeechSeq2Seq and its processor)"
        )
    # transformers 5 saves the feature extractor in processor_config.json.
    if not any(
        (folder / n).is_file() for n in ("preprocessor_config.json", "processor_config.json")
    ):
        raise ValidationError(
            f"model: {folder} has no preprocessor_config.json or processor_config.json (its "
            "feature extractor); save the processor there with processor.save_pretrained(folder)"
        )
    try:
        generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        generation = {}
    if isinstance(generation, dict) and generation.get("is_multilingual") is False:
        # An English-only model (a `.en` folder) takes no language or task.
        if params["task"] != "transcribe" or params["language"] not in ("", "en"):
            raise ValidationError(
                "model: an English-only model transcribes English only (task transcribe, "
                "language empty or en)"
            )
        return
    known = languages_of(generation)
    if params["language"] and known is not None and params["language"] not in known:
        raise ValidationError(
            f"language: {params['language']!r} is not one the model knows ({', '.join(known)})"
        )


SPEECH_FLAGS = {
    "flag_empty": ParamSpec(
        "yes", choices=("yes", "no"), help="flag a file in which no words were transcribed"
    ),
    **REPEAT_FLAGS,
}

SPEECH_TO_TEXT = ProcessorSpec(
    name="speech-to-text",
    title="Speech to text",
    help="A transcript with timed segments per audio file, from a local Whisper-style model.",
    output_suffix=".json",
    implementation="gpuworker.processors.speech_to_text:SpeechToTextProcessor",
    model_params=("model",),
    params={
        "model": ParamSpec(
            "",
            required=True,
            help="a local Hugging Face Whisper-style folder (AutoModelForSpeechSeq2Seq and "
            "its processor: preprocessor_config.json, tokenizer.json)",
        ),
        "language": ParamSpec(
            "",
            help="a language code the model knows (en, fr…); empty: detected for each file "
            "on its first 30 s, and recorded",
        ),
        "task": ParamSpec(
            "transcribe", choices=("transcribe", "translate"), help="translate: into English"
        ),
        "max_new_tokens": ParamSpec(
            128, type=int, minimum=1, maximum=440, help="tokens a 30 s window's transcript may have"
        ),
        "dtype": ParamSpec(
            "float32",
            choices=("float32", "float16", "bfloat16"),
            help="model precision; float16 and bfloat16 need a CUDA worker",
        ),
        "max_seconds": ParamSpec(
            3600.0,
            type=float,
            minimum=0.001,
            help="a longer file fails input_invalid, read from its header before it is decoded",
        ),
        "max_samples": ParamSpec(
            MAX_SAMPLES * 6,  # an hour of 48 kHz stereo
            type=int,
            minimum=1,
            help="an input (frames × channels) holding more samples fails input_invalid",
        ),
        "max_input_bytes": IMAGE_MAX_INPUT_BYTES,
        "batch_size": ParamSpec(8, type=int, minimum=1, maximum=4096, help="files per batch"),
        "batch_policy": ParamSpec("original", choices=("original", "length_grouped")),
        **SPEECH_FLAGS,
    },
    quick_check=_quick_check,
    deep_check=_deep_check,
    cost=speech_cost,
    cost_params=(),
    cost_unit="audio ms",
    check_input=_check_input,
    validate=validate_speech,
    read_limits=input_read_limits,
)
