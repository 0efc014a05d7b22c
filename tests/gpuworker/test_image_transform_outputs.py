"""Image transformation outputs: transparency kept where the format stores it,
and each output's dimensions checked against what its own input gives."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from PIL import Image

from campaigns.models import Unit, UnitState
from campaigns.runs import setup
from campaigns.specs.builtin import IMAGE_TRANSFORM, check_image_output
from campaigns.storage.outputs import WRONG_OUTPUT, InvalidOutput
from gpuworker.processors.image_transform import ImageTransformProcessor

RED = (255, 0, 0)


@pytest.fixture
def transparent(tmp_path) -> Path:
    """40×30 images whose left half is fully transparent and right half opaque."""
    root = tmp_path / "transparent"
    root.mkdir()
    rgba = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    rgba.paste((*RED, 255), (20, 0, 40, 30))
    rgba.save(root / "rgba.png")
    grey = Image.new("LA", (40, 30), (0, 0))
    grey.paste((255, 255), (20, 0, 40, 30))
    grey.save(root / "grey.png")
    return root


def _run(name: str, project, root: Path, run_here, **params) -> dict[str, Unit]:
    campaign, _ = setup.campaign_create(
        name=name, processor="image-transform", project=project, input_folder=root, params=params
    )
    run_here(campaign)
    return {u.uid: u for u in Unit.objects.filter(campaign=campaign)}


def _pixels(output_root: Path, unit: Unit, *points: tuple[int, int]) -> list[tuple]:
    assert unit.state == UnitState.SUCCEEDED, unit.error_message
    with Image.open(output_root / unit.output_path) as image:
        rgba = image.convert("RGBA")
    return [rgba.getpixel(point) for point in points]


def _close(pixel: tuple, expected: tuple, tolerance: int = 8) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, expected, strict=True))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("operation", "fmt", "width", "height"),
    [("convert", "png", 256, 256), ("convert", "webp", 256, 256), ("resize", "webp", 20, 15)],
)
def test_a_transparent_png_stays_transparent_in_a_format_with_alpha(
    operation, fmt, width, height, transparent, project, output_root, run_here
):
    units = _run(
        "alpha",
        project,
        transparent,
        run_here,
        operation=operation,
        format=fmt,
        width=width,
        height=height,
    )

    # Points well inside each half, in the output's own coordinates.
    scale = 0.5 if operation == "resize" else 1
    clear, opaque = (int(4 * scale), int(15 * scale)), (int(36 * scale), int(15 * scale))
    red_clear, red_opaque = _pixels(output_root, units["rgba.png"], clear, opaque)
    grey_clear, grey_opaque = _pixels(output_root, units["grey.png"], clear, opaque)
    assert red_clear[3] == 0 and grey_clear[3] == 0
    assert _close(red_opaque, (*RED, 255))
    assert _close(grey_opaque, (255, 255, 255, 255))


@pytest.mark.django_db
def test_jpeg_has_no_alpha_so_transparency_becomes_white(
    transparent, project, output_root, run_here
):
    units = _run("flat", project, transparent, run_here, operation="convert", format="jpeg")

    clear, opaque = _pixels(output_root, units["rgba.png"], (4, 15), (36, 15))
    assert _close(clear, (255, 255, 255, 255))
    assert _close(opaque, (*RED, 255))


def _params(**given) -> dict:
    return IMAGE_TRANSFORM.clean(given)


def test_the_check_wants_exactly_the_dimensions_its_input_gives(tmp_path):
    converted = _params(operation="convert", format="png")
    path = tmp_path / "out.png"
    Image.new("RGB", (40, 29), RED).save(path)

    with pytest.raises(InvalidOutput, match="40×29, expected 40×30") as refused:
        check_image_output(path, converted, source_size=(40, 30))
    assert refused.value.reason == WRONG_OUTPUT
    check_image_output(path, converted, source_size=(40, 29))

    # A thumbnail within the box but smaller than the input gives is refused too.
    thumbnail = _params(operation="thumbnail", width=64, height=64, format="png")
    with pytest.raises(InvalidOutput, match="40×29, expected 64×48"):
        check_image_output(path, thumbnail, source_size=(640, 480))


def _shrunk_by_one_pixel(real_transform):
    def transform(self, image, size):
        image = real_transform(self, image, size)
        return image.resize((image.width, image.height - 1))

    return transform


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("operation", "expected"), [("convert", "expected 40×30"), ("thumbnail", "expected 16×12")]
)
def test_an_output_of_other_dimensions_than_its_input_gives_is_not_a_result(
    operation, expected, transparent, project, output_root, run_here
):
    wrong = _shrunk_by_one_pixel(ImageTransformProcessor.transform)
    with mock.patch.object(ImageTransformProcessor, "transform", wrong):
        units = _run(
            "shrunk", project, transparent, run_here, operation=operation, width=16, height=16
        )

    unit = units["rgba.png"]
    assert (unit.state, unit.error_class) == (UnitState.FAILED, "output_invalid")
    assert expected in unit.error_message
