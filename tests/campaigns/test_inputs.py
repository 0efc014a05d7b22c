from __future__ import annotations

import pytest

from campaigns.inputs import InputError, decode_text, read_bytes


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty file"),
        (b"  \n\t ", "whitespace only"),
        ("café".encode("latin-1"), "not valid UTF-8: byte 0xe9 at offset 3"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
    ],
)
def test_bad_text_inputs_are_classified_with_a_readable_reason(data, reason):
    with pytest.raises(InputError) as info:
        decode_text(data)
    assert info.value.error_class == "input_invalid"
    assert reason in info.value.message


def test_utf8_text_with_a_bom_is_read():
    assert decode_text("\ufeffhéllo".encode()) == "héllo"


def test_missing_and_escaping_inputs(tmp_path):
    with pytest.raises(InputError) as missing:
        read_bytes(tmp_path, "gone.txt")
    assert missing.value.error_class == "input_missing"
    with pytest.raises(InputError) as escape:
        read_bytes(tmp_path, "../outside.txt")
    assert escape.value.error_class == "input_invalid"
