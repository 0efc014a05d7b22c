"""An input is read only as far as its processor can use: the rest of a
large text is counted (and hashed where the worker checks it), never held."""

from __future__ import annotations

import hashlib
import tracemalloc
from unittest import mock

import pytest

from campaigns.intake import inputs
from campaigns.intake.inputs import InputError, ReadLimits, decode_text, read_bytes
from campaigns.specs import builtin
from campaigns.specs.builtin import TEXT_EMBEDDING
from campaigns.specs.limits import TEXT_BYTES_PER_TOKEN

WORDS = "the harbour reopened on monday after three weeks of repairs café 港 "


def _large_text(tmp_path, size: int = 400_000):
    text = (WORDS * (size // len(WORDS.encode()) + 1)).encode()[:size]
    (tmp_path / "big.txt").write_bytes(text)
    return text


def test_a_cut_read_keeps_only_its_bound_and_counts_and_hashes_the_rest(tmp_path):
    whole = _large_text(tmp_path)
    data = read_bytes(tmp_path, "big.txt", limits=ReadLimits(keep=1000, digest=True))
    assert len(data) == 1000 and data == whole[:1000]
    assert data.cut and data.size == len(whole)
    assert data.sha256 == hashlib.sha256(whole).hexdigest()
    # Without the digest the read stops at the bound; the size comes from the file.
    quick = read_bytes(tmp_path, "big.txt", limits=ReadLimits(keep=1000))
    assert len(quick) == 1000 and quick.size == len(whole) and quick.sha256 is None


def test_a_small_file_under_the_bound_is_read_whole(tmp_path):
    (tmp_path / "small.txt").write_bytes(b"short text")
    data = read_bytes(tmp_path, "small.txt", limits=ReadLimits(keep=1000, digest=True))
    assert data == b"short text" and not data.cut
    assert data.sha256 == hashlib.sha256(b"short text").hexdigest()


def test_an_input_over_max_input_bytes_fails_input_invalid_with_its_size_unread(tmp_path):
    _large_text(tmp_path, 5000)
    with (
        mock.patch.object(inputs, "_input_bytes", wraps=inputs._input_bytes) as made,
        pytest.raises(InputError) as info,
    ):
        read_bytes(tmp_path, "big.txt", limits=ReadLimits(max_bytes=1000))
    assert info.value.error_class == "input_invalid"
    assert "5,000 bytes, over max_input_bytes 1,000" in info.value.message
    made.assert_not_called()


def test_a_cut_text_drops_a_split_character_and_ends_between_words():
    full = ("mot " * 10 + "港").encode()
    cut = inputs._input_bytes(full[:-1], len(full))  # the cut splits 港
    # The last word before the cut may be whole, or not: it goes too.
    assert decode_text(cut) == ("mot " * 9).rstrip()
    with pytest.raises(InputError, match="not valid UTF-8"):
        decode_text(full[:-1])  # a whole file that ends so is not UTF-8


def _spy(module, name: str):
    """Patches module.name with a wrapper that keeps what each call returned."""
    real, seen = getattr(module, name), []

    def wrapper(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    return mock.patch.object(module, name, wrapper), seen


def test_planning_tokenizes_only_what_the_model_can_use(tmp_path):
    _large_text(tmp_path)
    params = TEXT_EMBEDDING.clean({"max_tokens": 16})
    patch, seen = _spy(builtin, "read_bytes")
    with patch:
        assert builtin.text_token_costs(tmp_path, ["big.txt"], params) == [16]
    assert [len(data) for data in seen] == [16 * TEXT_BYTES_PER_TOKEN]


def test_the_one_file_cost_reads_only_its_bound_too(tmp_path):
    _large_text(tmp_path)
    params = TEXT_EMBEDDING.clean({"max_tokens": 16})
    patch, seen = _spy(builtin, "read_path")
    with patch:
        assert builtin.text_token_cost(tmp_path / "big.txt", params) == 16
    assert [len(data) for data in seen] == [16 * TEXT_BYTES_PER_TOKEN]


def test_the_unit_page_shows_an_output_up_to_the_cap_without_calling_it_a_bomb():
    """A transformation's output may be larger than an input may (max_output_pixels
    above max_pixels): the page decodes it for its thumbnail, up to that cap."""
    import io
    from types import SimpleNamespace

    from PIL import Image

    from campaigns.intake.images import MAX_PIXELS
    from campaigns.review.previews import _image_summary
    from campaigns.specs.builtin import IMAGE_TRANSFORM

    side = int((MAX_PIXELS * 1.1) ** 0.5)
    buffer = io.BytesIO()
    Image.new("L", (side, side), 128).save(buffer, format="PNG")
    params = IMAGE_TRANSFORM.clean(
        {"operation": "resize", "width": side, "height": side, "max_output_pixels": side * side}
    )
    campaign = SimpleNamespace(processor="image-transform")
    summary = _image_summary(campaign, params, buffer.getvalue())
    assert summary.kind == "image", summary.error
    assert summary.thumbnail.startswith("data:image/png;base64,")
    assert summary.dimensions == f"{side}×{side} PNG"


# --- a huge text in each path that reads an input for a person -----------------
# A 24 MB text: each path reads at most its bound of it (a few kB), so what
# Python allocates meanwhile stays far below the file (tracemalloc sees every
# bytes and str object made, however the file is read).
HUGE_BYTES = 24 * 2**20
READ_AT_MOST = 4 * 2**20


def _huge_text(folder) -> None:
    line = (WORDS * 40 + "\n").encode()
    with open(folder / "a-huge.txt", "wb") as fh:
        fh.write(line * (HUGE_BYTES // len(line) + 1))


def _traced_peak(call):
    """`call()` run twice, the second time traced (the first made what is made
    once: imports, compiled templates); its answer and its traced peak."""
    call()
    tracemalloc.start()
    try:
        answer = call()
        return answer, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.django_db
def test_the_input_preview_reads_only_the_start_of_a_huge_text(project, tmp_path):
    from campaigns.models import Unit
    from campaigns.review.previews import input_preview
    from campaigns.runs import setup

    folder = tmp_path / "texts"
    folder.mkdir()
    _huge_text(folder)
    campaign, _ = setup.campaign_create(
        name="huge", processor="text-embedding", project=project, input_folder=folder, params={}
    )
    unit = Unit.objects.get(campaign=campaign, uid="a-huge.txt")
    params = campaign.current_version.params
    preview, peak = _traced_peak(lambda: input_preview(unit=unit, campaign=campaign, params=params))
    assert preview.kind == "text" and preview.cut
    assert preview.text.startswith(WORDS.strip())
    assert peak < READ_AT_MOST, f"{peak / 2**20:.1f} MiB allocated"
