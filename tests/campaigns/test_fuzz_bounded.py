"""The fuzz tests' memory bound sees what it bounds (tests/fuzzing.py,
`bounded`): an image decoded or checked past the bound fails it, though
Pillow's pixels are no Python allocation, as does an array numpy allocates
without touching; a small one passes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from campaigns.intake.images import decode_image
from campaigns.specs.builtin import IMAGE_TRANSFORM, check_image_output
from tests.fuzzing import MEMORY_BOUND, bounded

# 6000×4000: 96,000,000 bytes decoded (4 a pixel), 1.5 × the bound; a PNG of
# one colour, a few hundred kB on disk.
SIDE = (6000, 4000)


def _png(size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 120, 200)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def test_decoding_an_image_larger_than_the_bound_fails_it():
    assert SIDE[0] * SIDE[1] * 4 > 1.4 * MEMORY_BOUND
    data = _png(SIDE)
    with pytest.raises(AssertionError, match="resident memory grew by 9[0-9] MiB"):
        bounded(lambda: decode_image(data, max_pixels=10**8), ())


def test_checking_an_image_output_larger_than_the_bound_fails_it(tmp_path):
    out = tmp_path / "out.png"
    out.write_bytes(_png(SIDE))
    params = IMAGE_TRANSFORM.clean(
        {"operation": "convert", "max_pixels": 10**8, "max_output_pixels": 10**8}
    )
    with pytest.raises(AssertionError, match="resident memory grew"):
        bounded(lambda: check_image_output(out, params, SIDE), ())


def test_an_array_allocated_but_never_touched_fails_it():
    with pytest.raises(AssertionError, match="traced peak"):
        bounded(lambda: np.empty(2 * MEMORY_BOUND, dtype=np.uint8), ())


def test_a_small_image_decoded_stays_within_it():
    data = _png((400, 300))
    assert bounded(lambda: decode_image(data), ()) is None
