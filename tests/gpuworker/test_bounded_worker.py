"""A worker's memory stays bounded on large inputs and outputs: a long text is
read only as far as the model uses it, an input over max_input_bytes fails
alone, an image output over max_output_pixels is refused before it is made,
and a batch's outputs are made and written one at a time."""

from __future__ import annotations

import tracemalloc
import weakref
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from django.core.exceptions import ValidationError
from PIL import Image

from campaigns.models import ErrorClass, Unit, UnitState
from campaigns.runs import setup
from campaigns.specs.builtin import IMAGE_TRANSFORM, TEXT_EMBEDDING
from campaigns.specs.limits import TEXT_BYTES_PER_TOKEN, output_pixel_bound
from campaigns.storage.vector_shards import VectorReader
from gpuworker.processors import get_processor
from gpuworker.processors.image_transform import ImageTransformProcessor
from gpuworker.runner import read as runner_read
from tests.images import png_claiming

pytestmark = pytest.mark.django_db

# Done: written and checked (a checkpoint may put some in the review queue).
DONE = (UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW)
WORDS = "the harbour reopened on monday after three weeks of repairs café 港 naïve "


def _campaign(name, processor, project, root, run_here, **params) -> dict[str, Unit]:
    campaign, _ = setup.campaign_create(
        name=name, processor=processor, project=project, input_folder=root, params=params
    )
    run_here(campaign)
    return {u.uid: u for u in Unit.objects.filter(campaign=campaign)}


@pytest.fixture
def texts(tmp_path) -> Path:
    root = tmp_path / "texts"
    root.mkdir()
    (root / "big.txt").write_text(WORDS * 8000)  # ~600 kB
    for i in range(3):
        (root / f"small{i}.txt").write_text(f"a short note, number {i}")
    return root


def test_a_long_text_is_read_only_as_far_as_the_model_uses_and_embeds_as_its_prefix(
    texts, project, output_root, run_here
):
    seen: list[bytes] = []
    real = runner_read.read_bytes

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    with mock.patch.object(runner_read, "read_bytes", spy):
        units = _campaign(
            "long", "text-embedding", project, texts, run_here, max_tokens=16, batch_size=8
        )
    assert all(u.state in DONE for u in units.values()), [u.error_message for u in units.values()]
    assert max(len(data) for data in seen) <= 16 * TEXT_BYTES_PER_TOKEN
    big = units["big.txt"]
    metrics = big.attempts.latest("pk").metrics
    assert metrics["truncated"] is True and metrics["tokens_estimated"] is True
    assert metrics["bytes"] == (texts / "big.txt").stat().st_size
    assert metrics["tokens"] > 16 * 100  # the whole text's, estimated: far over the cap
    # The vector is the whole text's, cut at max_tokens as the model cuts it.
    processor = get_processor("text-embedding", TEXT_EMBEDDING.clean({"max_tokens": 16}))
    whole = processor.embed([(texts / "big.txt").read_text()]).vectors[0]
    reader = VectorReader(str(output_root))
    stored = reader.vector(big.output_path)
    # Equal but for float32 rounding: the run embedded it in a batch of four, this
    # alone, and the kernels of different batch shapes may round differently
    # (another text's vector differs by far more than this).
    np.testing.assert_allclose(stored, whole, rtol=0, atol=1e-5)


def test_an_input_over_max_input_bytes_fails_alone_with_its_size(
    texts, project, output_root, run_here
):
    size = (texts / "big.txt").stat().st_size
    units = _campaign("capped", "text-embedding", project, texts, run_here, max_input_bytes=10_000)
    big = units["big.txt"]
    assert big.state == UnitState.FAILED and big.error_class == ErrorClass.INPUT_INVALID
    assert f"{size:,} bytes, over max_input_bytes 10,000" in big.error_message
    assert all(units[f"small{i}.txt"].state in DONE for i in range(3))


def test_a_resize_over_max_output_pixels_is_refused_before_a_version_is_made():
    with pytest.raises(ValidationError, match="over max_output_pixels"):
        IMAGE_TRANSFORM.clean({"operation": "resize", "width": 20000, "height": 20000})
    cleaned = IMAGE_TRANSFORM.clean(
        {"operation": "resize", "width": 2000, "height": 2000, "max_output_pixels": 5_000_000}
    )
    assert cleaned["max_output_pixels"] == 5_000_000


@pytest.fixture
def images(tmp_path) -> Path:
    root = tmp_path / "images"
    root.mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(root / "large.png")
    Image.new("RGB", (20, 15), (10, 200, 10)).save(root / "small.png")
    return root


def test_an_input_whose_output_is_over_max_output_pixels_fails_before_decoding(
    images, project, output_root, run_here
):
    with mock.patch(
        "gpuworker.processors.image_transform.decode_image",
        wraps=__import__("campaigns.intake.images", fromlist=["x"]).decode_image,
    ) as decoded:
        units = _campaign(
            "cap",
            "image-transform",
            project,
            images,
            run_here,
            operation="convert",
            max_output_pixels=1000,
        )
    large = units["large.png"]
    assert large.state == UnitState.FAILED and large.error_class == ErrorClass.INPUT_INVALID
    assert "40×30 = 1,200 pixels, over max_output_pixels 1,000" in large.error_message
    assert units["small.png"].state in DONE
    assert decoded.call_count == 1  # the small one only


def test_a_conversion_past_the_default_output_cap_fails_alone_and_says_how_to_allow_it(
    tmp_path, project, output_root, run_here
):
    # given: small images and, in their batch, one whose header says 8000×6000
    # (48 Mpx: an input may have 64,000,000)
    root = tmp_path / "photos"
    root.mkdir()
    for i in range(5):
        Image.new("RGB", (40, 30), (i * 50, 20, 200)).save(root / f"small{i}.png")
    (root / "huge.png").write_bytes(png_claiming(8000, 6000))
    # when: converted with the default parameters
    units = _campaign("past-cap", "image-transform", project, root, run_here, operation="convert")
    # then: the huge one fails with its reason, read from its header; the others are made
    huge = units["huge.png"]
    assert (huge.state, huge.error_class) == (UnitState.FAILED, ErrorClass.INPUT_INVALID)
    assert huge.error_message == (
        "its output would be 8000×6000 = 48,000,000 pixels, over max_output_pixels 40,000,000 "
        "(a larger max_output_pixels allows it, at 4 bytes of worker memory a pixel)"
    )
    for i in range(5):
        with Image.open(output_root / units[f"small{i}.png"].output_path) as out:
            assert out.convert("RGB").getcolors() == [(1200, (i * 50, 20, 200))]


def test_a_version_made_before_max_output_pixels_keeps_outputs_as_large_as_its_inputs():
    assert output_pixel_bound({"operation": "convert", "max_pixels": 64_000_000}) == 64_000_000
    assert output_pixel_bound(IMAGE_TRANSFORM.clean({"operation": "convert"})) == 40_000_000


def test_a_batch_makes_and_writes_one_output_at_a_time(tmp_path, project, output_root, run_here):
    root = tmp_path / "many"
    root.mkdir()
    for i in range(6):
        Image.new("RGB", (20 + i, 15), (i * 40, 0, 0)).save(root / f"{i}.png")
    made_images: list[weakref.ref] = []
    alive = []
    transform = ImageTransformProcessor.transform

    def tracked_transform(self, image, size):
        alive.append(sum(1 for ref in made_images if ref() is not None))
        made = transform(self, image, size)
        made_images.append(weakref.ref(made))
        return made

    with mock.patch.object(ImageTransformProcessor, "transform", tracked_transform):
        units = _campaign(
            "one-at-a-time",
            "image-transform",
            project,
            root,
            run_here,
            operation="resize",
            width=64,
            height=48,
            batch_size=6,
        )
    assert all(u.state in DONE for u in units.values())
    # Each enlargement made once the one before was written and let go of.
    assert len(alive) == 6 and max(alive) == 0


def _tracking_decodes():
    """decode_image wrapped: how many images it returned earlier are still
    held (by anyone) when each decode starts."""
    from campaigns.intake import images as intake_images

    decoded: list[weakref.ref] = []
    alive: list[int] = []

    def decode(*args, **kwargs):
        alive.append(sum(1 for ref in decoded if ref() is not None))
        image = intake_images.decode_image(*args, **kwargs)
        decoded.append(weakref.ref(image))
        return image

    return mock.patch("gpuworker.processors.image_transform.decode_image", decode), alive


@pytest.mark.parametrize("operation", ["thumbnail", "convert"])
def test_a_batch_holds_its_large_inputs_decoded_one_at_a_time(
    operation, tmp_path, project, output_root, run_here, settings
):
    # given: five inputs of 30,000 pixels in one batch, and a worker that
    # holds at most 50,000 decoded pixels at once
    settings.IMAGE_PIXEL_BUDGET = 50_000
    root = tmp_path / "large"
    root.mkdir()
    for i in range(5):
        Image.new("RGB", (200, 150), (i * 50, 80, 160)).save(root / f"{i}.png")
    tracking, alive = _tracking_decodes()
    # when
    with tracking:
        units = _campaign(
            f"large-{operation}",
            "image-transform",
            project,
            root,
            run_here,
            operation=operation,
            width=16,
            height=16,
            batch_size=5,
        )
    # then: every output made, from inputs decoded one at a time (a thumbnail
    # keeps its output only; a conversion keeps one input and decodes the
    # others again as it writes them)
    assert all(u.state in DONE for u in units.values()), [u.error_message for u in units.values()]
    assert max(alive) <= 1, alive
    for i in range(5):
        with Image.open(output_root / units[f"{i}.png"].output_path) as out:
            assert out.size == ((16, 12) if operation == "thumbnail" else (200, 150))
            assert out.convert("RGB").getpixel((5, 5)) == (i * 50, 80, 160)


def test_a_large_image_goes_alone_and_the_small_ones_of_its_batch_are_made_as_usual(
    tmp_path, project, output_root, run_here, settings
):
    # given: a worker that holds 10,000 decoded pixels at once, and a batch of
    # five small images and one of 60,000 pixels
    settings.IMAGE_PIXEL_BUDGET = 10_000
    root = tmp_path / "mixed"
    root.mkdir()
    for i in range(5):
        Image.new("RGB", (40, 30), (i * 50, 20, 200)).save(root / f"small{i}.png")
    large = Image.linear_gradient("L").resize((300, 200)).convert("RGB")
    large.save(root / "large.png")
    # when: all converted (to PNG: lossless, so the pixels must be the input's)
    tracking, alive = _tracking_decodes()
    with tracking:
        units = _campaign("mixed", "image-transform", project, root, run_here, operation="convert")
    # then: each output holds exactly its input's pixels
    assert all(u.state in DONE for u in units.values()), [u.error_message for u in units.values()]
    with Image.open(output_root / units["large.png"].output_path) as out:
        assert out.convert("RGB").tobytes() == large.tobytes()
    for i in range(5):
        with Image.open(output_root / units[f"small{i}.png"].output_path) as out:
            assert out.size == (40, 30)
            assert out.convert("RGB").getcolors() == [(1200, (i * 50, 20, 200))]
    # The large one was decoded twice (read, then written), the small ones
    # once, and the large one was never decoded beside more than the small
    # ones kept for their outputs.
    assert len(alive) == 7


def _uncompressed(root: Path, count: int, size: tuple[int, int]) -> dict[str, Image.Image]:
    """`count` BMPs of `size`: 3 bytes a pixel on disk, whatever they show."""
    root.mkdir()
    made = {}
    ramp = Image.linear_gradient("L").resize(size)
    for i in range(count):
        image = Image.merge("RGB", (ramp, Image.new("L", size, i * 20), ramp.rotate(180)))
        image.save(root / f"{i}.bmp")
        made[f"{i}.bmp"] = image
    return made


def test_a_batch_writing_its_outputs_holds_one_large_input_file_not_all_of_them(
    tmp_path, project, output_root, run_here, settings
):
    # given: ten 1500×1000 BMPs (4.5 MB each) converted in one batch, on a
    # worker whose pixel budget keeps none of them decoded until its output
    settings.IMAGE_PIXEL_BUDGET = 100_000
    root = tmp_path / "raw"
    inputs = _uncompressed(root, 10, (1500, 1000))
    each = (root / "0.bmp").stat().st_size
    from campaigns.intake import images as intake_images

    held: list[int] = []  # bytes Python holds as each image is decoded

    def decode(*args, **kwargs):
        held.append(tracemalloc.get_traced_memory()[0])
        return intake_images.decode_image(*args, **kwargs)

    # when
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with mock.patch("gpuworker.processors.image_transform.decode_image", decode):
            units = _campaign(
                "raw",
                "image-transform",
                project,
                root,
                run_here,
                operation="convert",
                batch_size=10,
            )
    finally:
        tracemalloc.stop()
    # then: every output holds its input's pixels, and while they were made
    # (each input's second decode) the batch held about one input's file, not
    # the ten of them (their bytes are read again from their files instead)
    assert all(u.state in DONE for u in units.values()), [u.error_message for u in units.values()]
    for name, image in inputs.items():
        with Image.open(output_root / units[name].output_path) as out:
            assert out.convert("RGB").tobytes() == image.tobytes()
    assert len(held) == 20
    writing = max(held[10:]) - base
    assert writing < 3 * each, f"{writing / each:.1f} input files held while writing"


def test_an_input_changed_before_its_output_is_made_fails_input_changed(
    tmp_path, project, output_root, run_here, settings
):
    # given: inputs kept as their files between reading and writing
    settings.IMAGE_PIXEL_BUDGET = 1000
    root = tmp_path / "changing"
    _uncompressed(root, 3, (60, 40))
    run = ImageTransformProcessor.run

    def run_then_change(self, items):
        # The batch has read its inputs; one of them changes before its output is made.
        Image.new("RGB", (60, 40), (255, 0, 0)).save(root / "1.bmp")
        return run(self, items)

    # when
    with mock.patch.object(ImageTransformProcessor, "run", run_then_change):
        units = _campaign(
            "changing", "image-transform", project, root, run_here, operation="convert"
        )
    # then: the changed one fails as changed, with no output left; the others are made
    changed = units["1.bmp"]
    assert (changed.state, changed.error_class) == (UnitState.FAILED, ErrorClass.INPUT_CHANGED)
    assert "input changed" in changed.error_message
    assert not list((output_root).rglob("1.png"))
    assert units["0.bmp"].state in DONE and units["2.bmp"].state in DONE


def test_the_profilers_sample_reads_only_what_the_model_uses_of_a_huge_text(project, tmp_path):
    # given: a 24 MB text among short ones, the heaviest of a profile's sample
    from campaigns.models import Profile
    from gpuworker.profiler import _Sample

    root = tmp_path / "huge"
    root.mkdir()
    line = (WORDS * 40 + "\n").encode()
    (root / "huge.txt").write_bytes(line * (24 * 2**20 // len(line) + 1))
    for i in range(3):
        (root / f"small{i}.txt").write_text(f"a short note, number {i}")
    campaign, _ = setup.campaign_create(
        name="profiled",
        processor="text-embedding",
        project=project,
        input_folder=root,
        params={"max_tokens": 16},
    )
    units = list(Unit.objects.filter(campaign=campaign).order_by("pk"))
    profile = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        sample=[u.pk for u in units],
        heavy=[u.pk for u in units if u.uid == "huge.txt"],
    )
    processor = get_processor("text-embedding", campaign.current_version.params)
    _Sample(profile, processor)  # once untraced: what is made once (imports) is made
    # when: the sample is read and prepared, traced
    tracemalloc.start()
    try:
        sample = _Sample(profile, processor)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # then: all four prepared, the huge one from its first max_tokens × 256 bytes:
    # far less than its file is allocated
    assert len(sample.items) == 4 and not sample.failed
    assert [row[0].uid for row in sample.heaviest] == ["huge.txt"]
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB allocated"
