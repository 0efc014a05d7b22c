"""Decoding an input image safely with Pillow, every failure classified.

Image.verify() accepts a JPEG cut in half; only a full load() raises, so an
image counts as readable only once it was decoded whole.
"""

from __future__ import annotations

import io
import threading
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from campaigns.intake.inputs import InputError
from campaigns.models import ErrorClass

# Pillow's own guard against decompression bombs (pixels), made an error.
MAX_PIXELS = 64_000_000
MAX_ASPECT = 50
# Pillow's limit (Image.MAX_IMAGE_PIXELS) and the warning filters are the
# process's, while images are opened by several threads (the batch runner's
# readers, the prefetch): each open sets its own limit under this lock. Only
# the header is parsed under it; decoding happens after.
_LIMIT = threading.Lock()


def open_image(source, max_pixels: int | None):
    """Image.open under a limit of max_pixels (None: no limit, for a header
    read alone), a DecompressionBombError past it."""
    with _LIMIT:
        previous = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = max_pixels
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                return Image.open(source)
        finally:
            Image.MAX_IMAGE_PIXELS = previous


def decode_image(
    data: bytes,
    *,
    max_pixels: int = MAX_PIXELS,
    max_aspect: int = MAX_ASPECT,
    keep_alpha: bool = False,
):
    """An RGB PIL image (RGBA when keep_alpha and it has transparency), EXIF
    orientation applied, or an InputError with the reason."""
    if not data:
        raise InputError(ErrorClass.INPUT_INVALID, "empty file")
    try:
        image = open_image(io.BytesIO(data), max_pixels)
        width, height = image.size
        if width * height > max_pixels:
            raise Image.DecompressionBombError(f"{width}×{height}")
        image.load()  # Pillow checks the size in open() only: ours came first
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"image too large: over {max_pixels:,} pixels (decompression bomb guard)",
        ) from None
    except UnidentifiedImageError:
        raise InputError(ErrorClass.INPUT_INVALID, "not an image Pillow can read") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise InputError(ErrorClass.INPUT_INVALID, f"truncated or corrupt image: {exc}") from None
    width, height = image.size
    if max(width, height) > max_aspect * min(width, height):
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"extreme aspect ratio {width}×{height} (more than {max_aspect}:1)",
        )
    # In place: turned when its EXIF says so, else left as it is (the copy
    # exif_transpose returns otherwise would hold the pixels twice).
    ImageOps.exif_transpose(image, in_place=True)
    return to_rgb(image, keep_alpha=keep_alpha)


def to_rgb(image, *, keep_alpha: bool = False):
    """CMYK, 16-bit and palette images as plain 8-bit RGB; a transparent one
    flattened onto white, or kept as RGBA with keep_alpha (a transformation
    whose output format stores transparency).

    An image already in the mode asked is not copied (convert to its own mode
    copies every pixel): its pixels go on in a plain image, without the file
    object it was read from, which would keep the file's bytes alive with them.
    """
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16/32-bit greyscale: scale to 8 bits instead of clipping to white.
        image = image.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = _as_mode(image, "RGBA")
        if keep_alpha:
            return image
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image)
    return _as_mode(image, "RGB")


def _as_mode(image, mode: str):
    if image.mode != mode:
        return image.convert(mode)
    image.load()
    return image._new(image.im)  # the same pixels, shared: no copy


def image_pixels(path) -> int | None:
    """Width × height from the header alone: the cost used for grouping.

    Only the header is read, so no limit is needed (None: no check).
    """
    with open_image(path, None) as image:
        width, height = image.size
    return max(1, width * height)
