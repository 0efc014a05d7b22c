"""Decoding an input image safely with Pillow, every failure classified.

Image.verify() accepts a JPEG cut in half; only a full load() raises, so an
image counts as readable only once it was decoded whole.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from .inputs import InputError
from .models import ErrorClass

# Pillow's own guard against decompression bombs (pixels), made an error.
MAX_PIXELS = 64_000_000
MAX_ASPECT = 50


def decode_image(data: bytes, *, max_pixels: int = MAX_PIXELS, max_aspect: int = MAX_ASPECT):
    """An RGB PIL image, EXIF orientation applied, or an InputError with the reason."""
    if not data:
        raise InputError(ErrorClass.INPUT_INVALID, "empty file")
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise Image.DecompressionBombError(f"{width}×{height}")
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"image too large: over {max_pixels:,} pixels (decompression bomb guard)",
        ) from None
    except UnidentifiedImageError:
        raise InputError(ErrorClass.INPUT_INVALID, "not an image Pillow can read") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise InputError(ErrorClass.INPUT_INVALID, f"truncated or corrupt image: {exc}") from None
    finally:
        Image.MAX_IMAGE_PIXELS = previous
    width, height = image.size
    if max(width, height) > max_aspect * min(width, height):
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"extreme aspect ratio {width}×{height} (more than {max_aspect}:1)",
        )
    image = ImageOps.exif_transpose(image)
    return to_rgb(image)


def to_rgb(image):
    """CMYK, 16-bit, palette and alpha images as plain 8-bit RGB."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16/32-bit greyscale: scale to 8 bits instead of clipping to white.
        image = image.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image)
    return image.convert("RGB")


def image_pixels(path) -> int:
    """Width × height from the header alone: the cost used for grouping."""
    with Image.open(path) as image:
        width, height = image.size
    return max(1, width * height)
