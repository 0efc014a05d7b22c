"""What a person sees of one unit: its input (a text's start, an image's
thumbnail) and its output summarised (top labels and margin, a vector's norm
and nearest neighbour, a transformed image beside what was asked).

The review pane and the unit page show the same; every read is bounded
(PREVIEW_MAX_BYTES, NEAREST_MAX) and a file that cannot be read says why
instead of failing the page.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from django.conf import settings

from campaigns.intake.audio import MEDIA_TYPES, audio_info
from campaigns.intake.images import MAX_ASPECT, MAX_PIXELS, decode_image, open_image
from campaigns.intake.inputs import InputError, ReadLimits, decode_text, read_bytes
from campaigns.intake.project_folders import campaign_folder_refusal
from campaigns.intake.records import carried, parse_locator
from campaigns.models import Attempt, Campaign, ErrorClass, Unit
from campaigns.review import holdout
from campaigns.specs.generation import completion_reader, read_completion_at
from campaigns.specs.limits import output_pixel_bound
from campaigns.specs.speech import read_transcript
from campaigns.storage.outputs import InvalidOutput, load_npz
from campaigns.storage.paths import resolve_input
from campaigns.storage.row_shards import is_row_shard
from campaigns.storage.vector_shards import VectorReader, split_member

EXCERPT_CHARS = 1500
# A text's excerpt reads no more than this of its file (UTF-8: 4 bytes a
# character at most).
EXCERPT_BYTES = EXCERPT_CHARS * 4 + 4
THUMBNAIL = (256, 256)
# Read into memory for a preview at most this much: a pixel limit alone would
# still read a multi-gigabyte file before refusing it.
PREVIEW_MAX_BYTES = 64 * 1024 * 1024
IMAGE_PROCESSORS = {"image-transform", "image-classification"}
GENERATION = "text-generation"
AUDIO_PROCESSORS = {"audio-transform", "speech-to-text"}
SPEECH = "speech-to-text"
#: An output's suffix that says it is audio (an audio transformation's formats).
AUDIO_SUFFIXES = {".wav", ".flac", ".ogg"}
#: Audio played in the page from a data: URL at most this large (a few minutes
#: of FLAC); a larger file shows its facts only.
PLAYABLE_BYTES = 8 * 1024 * 1024
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"}


def _read_limited(root: Path, relative: str) -> bytes:
    try:
        size = resolve_input(root, relative).stat().st_size
    except (OSError, ValueError):
        size = 0  # read_bytes says what is wrong, classified
    if size > PREVIEW_MAX_BYTES:
        raise InputError("too_large", f"{size:,} bytes: too large to preview here")
    return read_bytes(root, relative)


def _thumbnail(data: bytes, params: dict) -> str:
    """A small PNG as a data: URL: the browser never receives the original bytes."""
    image = decode_image(
        data,
        max_pixels=int(params.get("max_pixels", MAX_PIXELS)),
        max_aspect=int(params.get("max_aspect", MAX_ASPECT)),
    )
    image.thumbnail(THUMBNAIL)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass
class Preview:
    kind: str  # text / image / audio / error
    text: str = ""
    cut: bool = False
    thumbnail: str = ""
    error: str = ""
    audio: str = ""  # a data: URL the page plays ("" when too large to play here)
    facts: str = ""  # an audio file's rate, channels, length and format
    # A record's own parameters, where its row carries some (--param-column).
    params: list[tuple[str, str]] = field(default_factory=list)


def _audio(root: Path, relative: str) -> tuple[str, str]:
    """(data: URL or "", facts) of an audio file; InputError when it is no
    audio. A file over PLAYABLE_BYTES is not played: its header alone is read."""
    try:
        size = resolve_input(root, relative).stat().st_size
    except (OSError, ValueError):
        size = 0  # read_bytes says what is wrong, classified
    whole = size <= PLAYABLE_BYTES
    data = read_bytes(root, relative, limits=ReadLimits(keep=None if whole else 1 << 20))
    info = audio_info(data, whole=whole)
    facts = (
        f"{info.rate:,} Hz, {info.channels} channel{'s' if info.channels > 1 else ''}, "
        f"{info.seconds:,.2f} s, {info.format}"
    )
    if not whole:
        return "", facts + f" ({size:,} bytes: too large to play here)"
    kind = MEDIA_TYPES.get(info.format, "application/octet-stream")
    return f"data:{kind};base64," + base64.b64encode(data).decode("ascii"), facts


def input_preview(*, unit: Unit, campaign: Campaign, params: dict) -> Preview:
    is_image = (
        campaign.processor in IMAGE_PROCESSORS or Path(unit.source_path).suffix in IMAGE_SUFFIXES
    )
    refusal = campaign_folder_refusal(campaign)
    if refusal is not None:
        # The folder leads somewhere else now: what is there is not this campaign's to show.
        return Preview("error", error=f"{ErrorClass.INPUT_UNREADABLE}: {refusal}")
    root = Path(campaign.input_root)
    try:
        if campaign.processor in AUDIO_PROCESSORS:
            url, facts = _audio(root, unit.source_path)
            return Preview("audio", audio=url, facts=facts)
        if is_image:
            data = _read_limited(root, unit.source_path)
            return Preview("image", thumbnail=_thumbnail(data, params))
        located = parse_locator(unit.source_path) if "#" in unit.source_path else None
        if located is not None and located.params:
            return _carried_preview(root, unit.source_path)
        data = read_bytes(root, unit.source_path, limits=ReadLimits(keep=EXCERPT_BYTES))
        text = decode_text(data)
    except InputError as exc:
        return Preview("error", error=f"{exc.error_class}: {exc.message}")
    return Preview("text", text=text[:EXCERPT_CHARS], cut=data.cut or len(text) > EXCERPT_CHARS)


def _carried_preview(root: Path, source_path: str) -> Preview:
    """A row carrying parameters: its text, and its values beside it (the
    row's input is one JSON object, taken apart up to PREVIEW_MAX_BYTES)."""
    data = read_bytes(root, source_path, limits=ReadLimits(keep=PREVIEW_MAX_BYTES))
    if data.cut:  # too long to take apart here: its start as it is
        text = bytes(data[:EXCERPT_BYTES]).decode("utf-8", "replace")
        return Preview("text", text=text[:EXCERPT_CHARS], cut=True)
    found = carried(data)
    if found is None:
        return Preview("error", error=f"{ErrorClass.INPUT_INVALID}: not a row's input")
    text, values = found
    shown = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in values.items()]
    return Preview("text", text=text[:EXCERPT_CHARS], cut=len(text) > EXCERPT_CHARS, params=shown)


@dataclass
class Nearest:
    unit: Unit
    cosine: float
    compared: int


@dataclass
class OutputSummary:
    kind: str  # classification / embedding / image / none / error
    labels: list = field(default_factory=list)  # (label, probability)
    margin: float | None = None
    metrics: dict = field(default_factory=dict)
    twins: list = field(default_factory=list)  # units a duplicate_vector flag names
    nearest: Nearest | None = None  # the closest vector of the same batch
    thumbnail: str = ""
    dimensions: str = ""  # a transformed image: width×height and format, and what was asked
    asked: str = ""
    error: str = ""
    completion: dict = field(default_factory=dict)  # a generated text's output file
    transcript: dict = field(default_factory=dict)  # a speech-to-text output file
    audio: str = ""  # a transformed audio's data: URL ("" when too large to play)


def output_summary(
    *,
    unit: Unit,
    attempt: Attempt | None,
    campaign: Campaign,
    params: dict,
    twins: Sequence[str] = (),
) -> OutputSummary:
    """The output of this attempt (else the unit's current one); `twins`: the
    unit ids a duplicate_vector flag named."""
    # The attempt's own output: a unit processed again since (the holdout under
    # a new version) has a new one, and an output its check refused has none.
    rel = attempt.output_path if attempt is not None else unit.output_path
    if not rel:
        if attempt is not None and attempt.outcome == Attempt.Outcome.FAILED:
            return OutputSummary("error", error=attempt.error_message)
        return OutputSummary("none")
    file_rel, row = split_member(rel)
    if row is not None and is_row_shard(file_rel):  # a line of a batch's JSON row shard
        if campaign.processor == GENERATION:
            return _completion_summary(rel, params, unit.uid)
        return OutputSummary("none")  # a plugin's JSON line: the unit page names its place
    if row is not None:
        return _embedding_summary(campaign, attempt, twins)  # a row of a batch's shard
    suffix = Path(file_rel).suffix
    root = Path(settings.OUTPUT_ROOT)
    try:
        if suffix == ".npz":
            return _classification_summary(_read_limited(root, rel))
        if suffix in IMAGE_SUFFIXES:
            return _image_summary(campaign, params, _read_limited(root, rel))
        if suffix in AUDIO_SUFFIXES:
            url, facts = _audio(root, rel)
            return OutputSummary("audio", audio=url, dimensions=facts, asked=_asked_audio(params))
    except InputError as exc:
        return OutputSummary("error", error=f"{exc.error_class}: {exc.message}")
    if suffix == ".npy":
        return _embedding_summary(campaign, attempt, twins)
    if suffix == ".json" and campaign.processor == GENERATION:
        return _completion_summary(rel, params, unit.uid)
    if suffix == ".json" and campaign.processor == SPEECH:
        try:
            transcript = read_transcript(root / rel, params)
        except (OSError, InvalidOutput) as exc:
            return OutputSummary("error", error=f"unreadable transcript: {exc}")
        return OutputSummary("transcript", transcript=transcript)
    return OutputSummary("none")


def _completion_summary(rel: str, params: dict, uid: str) -> OutputSummary:
    try:
        record = read_completion_at(completion_reader(params), rel, params, uid)
    except (OSError, InvalidOutput) as exc:
        return OutputSummary("error", error=f"unreadable completion: {exc}")
    return OutputSummary("completion", completion=record)


def _asked_audio(params: dict) -> str:
    rate = int(params.get("sample_rate") or 0)
    asked = [f"{rate:,} Hz" if rate else "the input's rate"]
    asked.append("mono" if params.get("channels") == "mono" else "the input's channels")
    length = params.get("length", "keep")
    if length != "keep":
        asked.append(f"{length} {float(params.get('seconds', 0)):g} s")
    if params.get("loudness", "none") != "none":
        asked.append(f"{params['loudness']} at {float(params['target_dbfs']):g} dBFS")
    return ", ".join(asked) + f", {str(params.get('format', '')).upper()}"


def _image_summary(campaign: Campaign, params: dict, data: bytes) -> OutputSummary:
    """The transformed file: a thumbnail, its dimensions and format beside what was asked."""
    # An output is as large as its parameters allowed (max_output_pixels):
    # decoded for a thumbnail up to that, never refused as an input would be.
    cap = output_pixel_bound(params)
    try:
        with open_image(io.BytesIO(data), None) as image:  # the header only: no pixel decoded
            width, height, fmt = image.width, image.height, image.format or "?"
        thumbnail = (
            _thumbnail(data, {"max_pixels": cap, "max_aspect": max(width, height)})
            if width * height <= cap
            else ""  # a version made before the cap: shown, not decoded here
        )
    except (OSError, ValueError, InputError) as exc:
        return OutputSummary("error", error=f"unreadable image output: {exc}")
    asked = ""
    if campaign.processor == "image-transform" and "operation" in params:
        box = f"{params.get('width')}×{params.get('height')}"
        asked = {
            "resize": f"resize to {box}",
            "thumbnail": f"thumbnail within {box}",
        }.get(params["operation"], "same size")
        asked += f", {str(params.get('format', '')).upper()}"
    return OutputSummary(
        "image", thumbnail=thumbnail, dimensions=f"{width}×{height} {fmt}", asked=asked
    )


def _classification_summary(data: bytes) -> OutputSummary:
    try:
        out = load_npz(io.BytesIO(data))
        labels = [str(label) for label in out["top_labels"]]
        probs = [float(p) for p in out["top_probs"]]
        ranked = list(zip(labels, probs, strict=True))
        margin = float(out["margin"])
    except (OSError, ValueError, TypeError, KeyError, InvalidOutput) as exc:
        return OutputSummary("error", error=f"unreadable classification output: {exc}")
    return OutputSummary("classification", labels=ranked, margin=margin)


def _embedding_summary(
    campaign: Campaign, attempt: Attempt | None, twins: Sequence[str]
) -> OutputSummary:
    summary = OutputSummary("embedding", metrics=attempt.metrics if attempt else {})
    if twins:
        summary.twins = list(Unit.objects.filter(campaign=campaign, uid__in=twins).order_by("uid"))
    if attempt is not None and attempt.batch_id and attempt.output_path:
        summary.nearest = _nearest_in_batch(attempt)
    return summary


# Vectors read to find a unit's nearest neighbour: its batch's, at most this
# many (a few milliseconds each from a local disk; a token-budget batch can
# hold thousands of short texts).
NEAREST_MAX = 256


def _nearest_in_batch(attempt: Attempt) -> Nearest | None:
    """The most similar vector among the other outputs of the same batch.

    Cheap because bounded: a batch, not the campaign (that would need an index
    of every vector). A duplicate in another batch is found by the
    duplicate_vector rule, by hash, when the worker writes it.
    """
    reader = VectorReader(settings.OUTPUT_ROOT)
    own = holdout.unit_vector(reader, attempt.output_path)
    if own is None:
        return None
    others = (
        Attempt.objects.filter(batch_id=attempt.batch_id, outcome=Attempt.Outcome.SUCCEEDED)
        .exclude(unit_id=attempt.unit_id)
        .exclude(output_path="")
        .order_by("pk")
        .values_list("unit_id", "output_path")[:NEAREST_MAX]
    )
    best: tuple[float, int] | None = None
    compared = 0
    for unit_id, rel in others:
        vector = holdout.unit_vector(reader, rel)
        if vector is None or vector.shape != own.shape:
            continue
        compared += 1
        cosine = float(np.dot(own, vector))
        if best is None or cosine > best[0]:
            best = (cosine, unit_id)
    if best is None:
        return None
    return Nearest(unit=Unit.objects.get(pk=best[1]), cosine=best[0], compared=compared)
