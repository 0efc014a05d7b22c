"""Flag rules: outputs that look wrong go to a human, with the reason.

The thresholds are parameters of the processor, so they are part of the
parameter version (and of its fingerprint): a change is a new version. The
checks that need the model's numbers run in the worker (gpuworker/processors);
the reasons and the checks on plain numbers live here, without torch.
"""

from __future__ import annotations

import json

from django.db import models

from campaigns.specs.processors import ParamSpec
from campaigns.storage import outputs


class FlagReason(models.TextChoices):
    ABNORMAL_NORM = "abnormal_norm", "abnormal vector norm before normalisation"
    DUPLICATE_VECTOR = "duplicate_vector", "same vector as a different input"
    TRUNCATED = "truncated", "input truncated beyond the allowed share"
    CLOSE_CATEGORIES = "close_categories", "close to several categories"
    LOW_CONFIDENCE = "low_confidence", "low top-1 confidence"
    CATEGORY_DRIFT = "category_drift", "category share drifts from the checkpoint sample"
    TINY_INPUT = "tiny_input", "tiny input image"
    EXTREME_ASPECT = "extreme_aspect", "extreme aspect ratio"
    EMPTY_COMPLETION = "empty_completion", "empty completion"
    STOPPED_BY_LENGTH = "stopped_by_length", "completion cut at max_new_tokens"
    REPEATED_TEXT = "repeated_text", "completion repeats itself"
    REFUSAL = "refusal", "completion reads as a refusal"
    SILENT_AUDIO = "silent_audio", "silent audio"
    CLIPPED_AUDIO = "clipped_audio", "clipped audio"
    WRONG_EXTENSION = "wrong_extension", "file name says another format"
    EMPTY_TRANSCRIPT = "empty_transcript", "empty transcript"
    # Outputs that failed their check: the unit fails (output_invalid) and a
    # person sees the item; the reason counts at the checkpoint like any flag.
    NON_FINITE = outputs.NON_FINITE, "NaN or Inf in the output"
    WRONG_OUTPUT = outputs.WRONG_OUTPUT, "output dimensions or format not as asked"
    OUTPUT_INVALID = outputs.OUTPUT_INVALID, "output failed its check"
    MANUAL = "manual", "flagged by hand"
    SPOT_CHECK = "spot_check", "checkpoint spot check"


def reason_label(reason: str) -> str:
    """A flag reason as people read it; a reason no longer known, as it is."""
    return FlagReason(reason).label if reason in FlagReason.values else reason


TEXT_EMBEDDING_FLAGS = {
    "flag_truncated_share": ParamSpec(
        0.95,
        type=float,
        minimum=0,
        maximum=1,
        help="flag a text when more than this share of its tokens was cut (1: never)",
    ),
    "flag_norm_min": ParamSpec(
        0.05,
        type=float,
        minimum=0,
        help="flag a vector whose norm before normalisation is below this (0: never)",
    ),
    "flag_norm_max": ParamSpec(
        0.0,
        type=float,
        minimum=0,
        help="flag a vector whose norm before normalisation is above this (0: never)",
    ),
}
CLASSIFICATION_FLAGS = {
    "flag_min_margin": ParamSpec(
        0.15,
        type=float,
        minimum=0,
        maximum=1,
        help="flag when top-1 minus top-2 probability is below this (close to several)",
    ),
    "flag_min_confidence": ParamSpec(
        0.5, type=float, minimum=0, maximum=1, help="flag when the top-1 probability is below this"
    ),
    "flag_max_drift": ParamSpec(
        0.5,
        type=float,
        minimum=0,
        maximum=1,
        help="after a passed checkpoint, flag a batch's units of a category whose share "
        "exceeds the spot-check sample's by more than this (1: never)",
    ),
}

DRIFT_MIN_BATCH = 10  # fewer units say nothing about a distribution


def drifting_categories(
    batch_categories: list[str], reference: list[str], threshold: float
) -> dict[str, tuple[float, float]]:
    """Categories over-represented in a batch against the reference sample:
    {category: (share in batch, share in reference)}."""
    if threshold >= 1 or len(batch_categories) < DRIFT_MIN_BATCH or not reference:
        return {}
    drifting = {}
    for category in set(batch_categories):
        share = batch_categories.count(category) / len(batch_categories)
        expected = reference.count(category) / len(reference)
        if share - expected > threshold:
            drifting[category] = (share, expected)
    return drifting


IMAGE_INPUT_FLAGS = {
    "flag_min_side": ParamSpec(
        16, type=int, minimum=0, help="flag inputs whose shorter side has fewer pixels (0: never)"
    ),
    "flag_max_aspect": ParamSpec(
        6, type=int, minimum=0, help="flag inputs longer than this × their width (0: never)"
    ),
}


def truncation_flags(tokens: int, max_tokens: int, params: dict) -> list[tuple[str, str]]:
    share = float(params.get("flag_truncated_share", 1.0))
    if tokens <= max_tokens or share >= 1:
        return []
    cut = (tokens - max_tokens) / tokens
    if cut <= share:
        return []
    return [(FlagReason.TRUNCATED, f"{tokens} tokens, {cut:.0%} cut at max_tokens {max_tokens}")]


def norm_flags(norm: float, params: dict) -> list[tuple[str, str]]:
    low, high = float(params.get("flag_norm_min", 0)), float(params.get("flag_norm_max", 0))
    if low and norm < low:
        return [(FlagReason.ABNORMAL_NORM, f"norm {norm:.4g} below {low:g}")]
    if high and norm > high:
        return [(FlagReason.ABNORMAL_NORM, f"norm {norm:.4g} above {high:g}")]
    return []


def classification_flags(probs: list[float], labels: list[str], params: dict):
    ranked = sorted(zip(probs, labels, strict=True), reverse=True)
    flags = []
    if len(ranked) > 1:
        margin = ranked[0][0] - ranked[1][0]
        if margin < float(params.get("flag_min_margin", 0)):
            flags.append(
                (
                    FlagReason.CLOSE_CATEGORIES,
                    f"{ranked[0][1]} {ranked[0][0]:.2f} vs {ranked[1][1]} {ranked[1][0]:.2f} "
                    f"(margin {margin:.2f})",
                )
            )
    if ranked and ranked[0][0] < float(params.get("flag_min_confidence", 0)):
        flags.append((FlagReason.LOW_CONFIDENCE, f"top-1 {ranked[0][1]} at {ranked[0][0]:.2f}"))
    return flags


def image_input_flags(width: int, height: int, params: dict) -> list[tuple[str, str]]:
    flags: list[tuple[str, str]] = []
    side = int(params.get("flag_min_side", 0))
    if side and min(width, height) < side:
        flags.append((FlagReason.TINY_INPUT, f"{width}×{height} pixels"))
    aspect = int(params.get("flag_max_aspect", 0))
    if aspect and max(width, height) > aspect * max(1, min(width, height)):
        flags.append((FlagReason.EXTREME_ASPECT, f"{width}×{height} pixels"))
    return flags


REPEAT_FLAGS = {
    "flag_repeat_ngram": ParamSpec(
        4,
        type=int,
        minimum=0,
        maximum=64,
        help="flag a text in which a run of this many words is said flag_repeat_times "
        "times in a row: a model stuck in a loop (0: never)",
    ),
    "flag_repeat_times": ParamSpec(3, type=int, minimum=2, maximum=1000),
}


def repeated_words(text: str, params: dict) -> list[tuple[str, str]]:
    """A run of `flag_repeat_ngram` words said `flag_repeat_times` times in a
    row: a model stuck in a loop (a completion, a transcript). Back to back
    only: a phrase that comes back now and then in a long text is no loop."""
    size, times = int(params.get("flag_repeat_ngram", 0)), int(params.get("flag_repeat_times", 3))
    words = text.split()
    if not size:
        return []
    for at in range(len(words) - size * times + 1):
        gram = words[at : at + size]
        if all(words[at + k * size : at + (k + 1) * size] == gram for k in range(1, times)):
            return [(FlagReason.REPEATED_TEXT, f"{' '.join(gram)!r} {times} times in a row")]
    return []


def transcript_flags(text: str, params: dict) -> list[tuple[str, str]]:
    """A transcript's review rules: empty (no speech found), or repeating itself."""
    flags: list[tuple[str, str]] = []
    if not text.strip() and params.get("flag_empty", "yes") == "yes":
        flags.append((FlagReason.EMPTY_TRANSCRIPT, "no words transcribed"))
    return flags + repeated_words(text, params)


def completion_flags(completion: str, finish_reason: str, params: dict) -> list[tuple[str, str]]:
    """A generated text's review rules: empty, cut at max_new_tokens, a run of
    words that keeps coming back, a refusal phrase (docs/processors.md)."""
    flags: list[tuple[str, str]] = []
    if not completion.strip():
        flags.append((FlagReason.EMPTY_COMPLETION, f"nothing but whitespace ({finish_reason})"))
    if finish_reason == "length" and params.get("flag_length", "no") == "yes":
        flags.append(
            (FlagReason.STOPPED_BY_LENGTH, f"cut at max_new_tokens {params['max_new_tokens']}")
        )
    flags += repeated_words(completion, params)
    folded = completion.casefold()
    for phrase in json.loads(params.get("flag_refusals") or "[]"):
        if phrase.casefold() in folded:
            flags.append((FlagReason.REFUSAL, f"says {phrase!r}"))
            break
    return flags


AUDIO_FLAGS = {
    "flag_silent_dbfs": ParamSpec(
        -60.0,
        type=float,
        minimum=-200,
        maximum=0,
        help="flag an input whose peak is below this many dBFS (-200: never)",
    ),
    "flag_clipped_share": ParamSpec(
        0.001,
        type=float,
        minimum=0,
        maximum=1,
        help="flag an input with more than this share of its samples at full scale (1: never)",
    ),
}


def audio_flags(
    peak_dbfs: float, clipped_share: float, source, params: dict
) -> list[tuple[str, str]]:
    """`source`: the input's campaigns.intake.audio.AudioInfo."""
    flags: list[tuple[str, str]] = []
    if source.named_as:
        flags.append(
            (
                FlagReason.WRONG_EXTENSION,
                f"named as {source.named_as}, holds {source.format} (decoded as {source.format})",
            )
        )
    silent = float(params.get("flag_silent_dbfs", -200))
    if peak_dbfs < silent:
        flags.append((FlagReason.SILENT_AUDIO, f"peak {peak_dbfs:.1f} dBFS, below {silent:g}"))
    share = float(params.get("flag_clipped_share", 1))
    if share < 1 and clipped_share > share:
        flags.append(
            (FlagReason.CLIPPED_AUDIO, f"{clipped_share:.2%} of the samples at full scale")
        )
    return flags
