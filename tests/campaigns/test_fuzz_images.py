"""Fuzzed input images: any bytes decode to an RGB(A) image or fail as InputError.

campaigns/intake/images.py: `decode_image` is the only door from an input
file to a model; whatever the format, mode or damage, the unit fails with a
classified reason (input_invalid) or gets an 8-bit RGB image, and a header
claiming billions of pixels is refused before decoding.
"""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from campaigns.intake.images import decode_image, image_pixels
from campaigns.intake.inputs import InputError
from tests.fuzzing import bounded, damaged
from tests.images import png_claiming


def _save(mode: str, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image = Image.new(mode, (12, 9))
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


#: One small image of each format and mode a corpus may hold.
GOOD = [
    _save("RGB", "PNG"),
    _save("RGBA", "PNG"),
    _save("P", "PNG", transparency=0),
    _save("I;16", "PNG"),
    _save("1", "PNG"),
    _save("RGB", "JPEG"),
    _save("CMYK", "JPEG"),
    _save("L", "JPEG", progressive=True),
    _save("RGBA", "WEBP"),
    _save("P", "GIF"),
    _save("RGB", "BMP"),
    _save("RGB", "TIFF"),
    _save("F", "TIFF"),
    _save("I", "TIFF"),
    _save("LAB", "TIFF"),
    _save("CMYK", "TIFF", compression="tiff_lzw"),
    _save("LA", "TIFF"),
    _save("YCbCr", "JPEG"),
    _save("RGB", "ICO"),
    _save("RGB", "PPM"),
]
images = st.one_of(
    st.sampled_from(GOOD),
    st.sampled_from(GOOD).flatmap(damaged),
    st.binary(max_size=128),
    st.builds(png_claiming, st.integers(1, 2**31 - 1), st.integers(1, 2**31 - 1)),
)


@given(data=images, keep_alpha=st.booleans())
def test_an_input_image_decodes_to_rgb_or_fails_with_a_reason(data, keep_alpha):
    result: list = []
    raised = bounded(
        lambda: result.append(decode_image(data, max_pixels=10**6, keep_alpha=keep_alpha)),
        (InputError,),
    )
    if raised is not None:
        assert raised.error_class == "input_invalid" and raised.message
    else:
        assert result[0].mode in (("RGB", "RGBA") if keep_alpha else ("RGB",))


@given(data=images)
def test_an_image_header_is_read_for_its_pixels_or_refused_as_oserror(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "pixels.bin"
    path.write_bytes(data)
    pixels = None
    try:
        pixels = image_pixels(path)
    except (OSError, SyntaxError, ValueError):
        return
    assert pixels >= 1
