"""How much of an input a processor reads, and how large an output it may make.

Both sides use these: planning, the setup page and the previews (without
torch), the worker and the profiler. docs/processors.md, "Long inputs and
large outputs", says what a user sees of them.
"""

from __future__ import annotations

import io
import unicodedata

from django.core.exceptions import ValidationError

from campaigns.intake.images import MAX_PIXELS, open_image
from campaigns.intake.inputs import InputError, ReadLimits, chars_named
from campaigns.models import ErrorClass
from campaigns.specs.processors import ParamSpec

#: Bytes of a text read for each token the model sees. A token of ordinary
#: text is a few bytes (a word over 100 characters is one [UNK]): past
#: max_tokens × this, nothing more of a text reaches the model, and the rest of
#: the file is counted, not loaded (docs/processors.md, "Long inputs").
TEXT_BYTES_PER_TOKEN = 256


def max_input_bytes(params: dict) -> int | None:
    """The version's max_input_bytes; None for no limit (0, or a version made
    before the parameter)."""
    return int(params.get("max_input_bytes") or 0) or None


def text_read_limits(params: dict) -> ReadLimits:
    """How much of a text planning, previews, the profiler and the worker read."""
    return ReadLimits(
        keep=int(params["max_tokens"]) * TEXT_BYTES_PER_TOKEN, max_bytes=max_input_bytes(params)
    )


def input_read_limits(params: dict) -> ReadLimits:
    """An image or other input: read whole, up to max_input_bytes."""
    return ReadLimits(max_bytes=max_input_bytes(params))


MAX_INPUT_BYTES = ParamSpec(
    0,
    type=int,
    minimum=0,
    help="inputs larger than this many bytes fail as input_invalid before they are read; "
    "0: no limit",
)


# A training example is read whole (its JSON parsed) and its texts kept for
# the whole training: this bounds each file. A pair of a query and a few
# paragraphs is a few KiB; only the first max_tokens tokens of each text train.
TEXT_EXAMPLE_MAX_INPUT_BYTES = ParamSpec(
    16 << 20,
    type=int,
    minimum=0,
    help="examples larger than this many bytes fail as input_invalid before they are read; "
    "0: no limit",
)

# An image is read whole before its header says what it is: this bounds
# that read. No image under max_pixels needs more (64 Mpx of 16-bit RGBA
# uncompressed is 512 MiB).
IMAGE_MAX_INPUT_BYTES = ParamSpec(
    1 << 30,
    type=int,
    minimum=0,
    help="inputs larger than this many bytes fail as input_invalid before they are read; "
    "0: no limit",
)

#: A transformation's largest output by default (8000 × 5000). A worker holds
#: an output whole while it is made, encoded and checked, 4 bytes a pixel:
#: 153 MiB here, within the +200 MB a worker may grow by on a huge output
#: (bench/RESULTS.md, "Bounded memory on huge inputs and outputs"; at the
#: 64,000,000 an input may have, one output alone is 245 MiB).
MAX_OUTPUT_PIXELS = 40_000_000


def refuse_over_max_tokens(data: bytes, tokens: int, max_tokens: int) -> None:
    """truncation=refuse: a text over max_tokens fails input_invalid. Of a text
    read in part (InputBytes.cut), `tokens` counts the part read."""
    size = getattr(data, "size", len(data))
    if size > len(data):
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"{size:,} bytes, over max_tokens {max_tokens} ({tokens} tokens in its first "
            f"{len(data):,} bytes; truncation=refuse)",
        )
    if tokens > max_tokens:
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"{tokens} tokens, over max_tokens {max_tokens} (truncation=refuse)",
        )


# The Unicode categories some tokenizers drop whole: marks (Mn, Mc, Me; a
# model that strips accents drops them, variation selectors are Mn), control,
# format, private-use and unassigned characters (C*), separators (Z*). A text
# with any other character (a letter, a digit, punctuation, a symbol) leaves
# at least one token, if only [UNK], so only a text of these alone is
# tokenized to find out.
_DROPPABLE = frozenset("MCZ")


def refuse_without_tokens(text: str, tokenizer) -> None:
    """A text its model's tokenizer reduces to nothing fails input_invalid: it
    would embed as the special tokens alone, one vector for every such file.
    `tokenizer`: a `tokenizers.Tokenizer` without padding."""
    if any(unicodedata.category(char)[0] not in _DROPPABLE for char in text):
        return
    if tokenizer.encode(text, add_special_tokens=False).ids:
        return
    raise InputError(
        ErrorClass.INPUT_INVALID,
        f"only characters the model's tokenizer drops ({chars_named(text)}: combining "
        "marks, variation selectors or the like), nothing to embed",
    )


def expected_size(width: int, height: int, params: dict) -> tuple[int, int]:
    """The dimensions a transformation must produce from a width × height input."""
    target_w, target_h = int(params["width"]), int(params["height"])
    if params["operation"] == "resize":
        return target_w, target_h
    if params["operation"] == "thumbnail":
        scale = min(target_w / width, target_h / height, 1.0)
        return max(1, round(width * scale)), max(1, round(height * scale))
    return width, height  # convert: same pixels, another format


def output_pixel_bound(params: dict) -> int:
    """No output of a transformation's parameters is larger than this. A
    version made before the parameter had none: its outputs are as large as
    its inputs may be."""
    return int(params.get("max_output_pixels") or MAX_PIXELS)


def validate_transform(params: dict) -> None:
    """A resize over max_output_pixels is refused before a version is made:
    every output of it would fail, each after costing its full size in memory."""
    width, height = int(params["width"]), int(params["height"])
    cap = output_pixel_bound(params)
    if params["operation"] == "resize" and width * height > cap:
        raise ValidationError(
            f"resize to {width}×{height} makes {width * height:,}-pixel outputs, over "
            f"max_output_pixels {cap:,}; ask for a smaller size or raise max_output_pixels"
        )


def check_output_pixels(data: bytes, params: dict) -> tuple[int, int] | None:
    """An input whose output would be over max_output_pixels fails input_invalid,
    from its header alone: before it is decoded and its output made. Its
    width × height as the header says, None for no image header."""
    try:
        with open_image(io.BytesIO(data), None) as image:  # the header only
            width, height = image.size
    except Exception:
        return None  # not an image: decoding says why, classified
    out_w, out_h = expected_size(width, height, params)
    cap = output_pixel_bound(params)
    if out_w * out_h > cap:
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"its output would be {out_w}×{out_h} = {out_w * out_h:,} pixels, over "
            f"max_output_pixels {cap:,} (a larger max_output_pixels allows it, at "
            f"4 bytes of worker memory a pixel)",
        )
    return width, height
