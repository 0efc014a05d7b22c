from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from PIL import Image

from campaigns.intake.images import decode_image
from campaigns.intake.inputs import InputError
from campaigns.models import Unit, UnitState
from campaigns.runs import setup
from campaigns.verify.reconcile import campaign_verify
from tests.images import png_claiming, write_image_corpus

# The bomb test image is 36 Mpx; the tests set the guard below it.
LIMIT = 20_000_000


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("images")
    return root, write_image_corpus(root)


def test_every_image_decodes_to_rgb_or_fails_with_its_reason(images):
    root, expected = images
    for rel, outcome in expected.items():
        data = (root / rel).read_bytes()
        if outcome == "ok":
            image = decode_image(data, max_pixels=LIMIT)
            assert image.mode == "RGB", rel
        else:
            with pytest.raises(InputError) as info:
                decode_image(data, max_pixels=LIMIT)
            assert info.value.error_class == "input_invalid", rel
            assert outcome in info.value.message, (rel, info.value.message)


def test_exif_orientation_is_applied(images):
    root, _ = images
    image = decode_image((root / "ok/exif-rotated.jpg").read_bytes())
    assert image.size == (200, 400)


def test_alpha_is_composited_on_white_and_16_bit_is_scaled(images):
    root, _ = images
    alpha = decode_image((root / "ok/alpha.png").read_bytes())
    assert alpha.getpixel((0, 0)) == (127, 127, 255)
    grey = decode_image((root / "ok/sixteen-bit.png").read_bytes())
    assert grey.getpixel((0, 0)) == (156, 156, 156)  # 40000 / 256, not clipped to 255


@pytest.mark.django_db
def test_an_image_transform_campaign_checks_every_output(images, project, output_root, run_here):
    root, expected = images
    campaign, _ = setup.campaign_create(
        name="thumbs",
        processor="image-transform",
        project=project,
        input_folder=root,
        params={
            "operation": "thumbnail",
            "width": 128,
            "height": 128,
            "format": "webp",
            "max_pixels": LIMIT,
        },
    )
    run_here(campaign)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    for rel, outcome in expected.items():
        unit = units[rel]
        if outcome == "ok":
            assert unit.state == UnitState.SUCCEEDED, (rel, unit.error_message)
            with Image.open(output_root / unit.output_path) as out:
                assert out.format == "WEBP"
                assert max(out.size) <= 128
            assert unit.output_path.endswith(".webp")
        else:
            assert (unit.state, unit.error_class) == ("failed", "input_invalid"), rel
            assert outcome in unit.error_message
    rgb = units["ok/rgb.jpg"]
    with Image.open(output_root / rgb.output_path) as out:
        assert out.size == (128, 96)  # 640×480 kept its aspect ratio
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["valid"] == sum(1 for o in expected.values() if o == "ok")
    assert report["orphan_outputs"] == 0


@pytest.mark.django_db
def test_a_resized_output_of_the_wrong_size_is_not_a_result(images, project, output_root, run_here):
    from gpuworker.processors.image_transform import ImageTransformProcessor

    root, _ = images
    campaign, _ = setup.campaign_create(
        name="resized",
        processor="image-transform",
        project=project,
        input_folder=root / "ok",
        params={"operation": "resize", "width": 64, "height": 64, "format": "png"},
    )
    real_transform = ImageTransformProcessor.transform

    def off_by_some(self, image, size):
        return real_transform(self, image, (64, 63))

    with mock.patch.object(ImageTransformProcessor, "transform", off_by_some):
        run_here(campaign)
    unit = Unit.objects.filter(campaign=campaign).first()
    assert unit.error_class == "output_invalid"
    assert "64×63, asked 64×64" in unit.error_message


@pytest.mark.django_db
def test_a_decompression_bomb_fails_its_unit_and_the_campaign_still_runs(
    tmp_path, project, output_root, run_here
):
    # given: ordinary images and one whose header claims 30000×30000 pixels,
    # over Pillow's own hard limit, in a campaign that weighs every input
    root = tmp_path / "corpus"
    root.mkdir()
    for index in range(3):
        Image.new("RGB", (40 + index, 30), (10, 20, 30)).save(root / f"ok-{index}.png")
    (root / "bomb.png").write_bytes(png_claiming(30000, 30000))
    campaign, _ = setup.campaign_create(
        name="bombed",
        processor="image-transform",
        project=project,
        input_folder=root,
        params={"operation": "thumbnail", "width": 16, "height": 16, "batch_size": 2}
        | {"batch_policy": "length_grouped"},
    )

    # when
    run_here(campaign)

    # then
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    bomb = units.pop("bomb.png")
    assert (bomb.state, bomb.error_class) == (UnitState.FAILED, "input_invalid")
    assert "decompression bomb guard" in bomb.error_message
    assert {u.state for u in units.values()} == {UnitState.SUCCEEDED}
