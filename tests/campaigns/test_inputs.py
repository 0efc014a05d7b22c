from __future__ import annotations

import os

import pytest

from campaigns.intake.inputs import InputError, decode_text, read_bytes


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


@pytest.mark.parametrize(
    "text",
    [
        "\u200b\u200c\x01",  # zero-width space and non-joiner, a control character
        "\ufeff\u200b \n\u2060\u200e\x7f\t",  # BOM, word joiner, LTR mark, DEL, whitespace
        "\x1b\x1b\x1b" * 5000,
    ],
)
def test_text_of_only_control_or_zero_width_characters_is_refused_like_whitespace(text):
    with pytest.raises(InputError) as info:
        decode_text(text.encode())
    assert info.value.error_class == "input_invalid"
    assert "nothing to embed" in info.value.message
    assert "control or zero-width characters only" in info.value.message


def test_text_with_content_among_zero_width_characters_is_read():
    assert decode_text("\u200bx\u200c".encode()) == "\u200bx\u200c"
    assert decode_text(("\u200b" * 10_000 + "é").encode()).endswith("é")


def test_utf8_text_with_a_bom_is_read():
    assert decode_text("\ufeffhéllo".encode()) == "héllo"


def test_missing_and_escaping_inputs(tmp_path):
    with pytest.raises(InputError) as missing:
        read_bytes(tmp_path, "gone.txt")
    assert missing.value.error_class == "input_missing"
    with pytest.raises(InputError) as escape:
        read_bytes(tmp_path, "../outside.txt")
    assert escape.value.error_class == "input_invalid"


def _outcome(root, source_path, real_root=None):
    try:
        return ("read", read_bytes(root, source_path, real_root))
    except InputError as exc:
        return (exc.error_class, exc.message.replace(str(root.resolve()), "<root>"))


def test_the_fd_check_reads_and_refuses_exactly_as_resolving_the_path_does(tmp_path, monkeypatch):
    """Linux checks the opened file's real path (/proc/self/fd); elsewhere the
    path is resolved first. Same answer, same class, for every kind of path."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"not yours")
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"inside")
    (root / "sub" / "b.txt").write_bytes(b"deeper")
    (root / "link-out.txt").symlink_to(outside / "secret.txt")
    (root / "link-dir-out").symlink_to(outside)
    (root / "link-in.txt").symlink_to(root / "a.txt")
    (tmp_path / "alias").symlink_to(root)  # the corpus root itself reached by a symlink
    os.mkfifo(outside / "pipe")  # opened for a check, it must not hang the reader
    (root / "link-pipe").symlink_to(outside / "pipe")
    cases = [
        "a.txt",
        "sub/b.txt",
        "sub/../a.txt",
        "../outside/secret.txt",
        str(outside / "secret.txt"),
        "link-out.txt",
        "link-dir-out/secret.txt",
        "link-in.txt",
        "sub",
        "",
        "gone.txt",
        "../outside/gone.txt",
        "nul\x00.txt",
        "link-pipe",
    ]
    import campaigns.intake.inputs as inputs

    for base in (root, tmp_path / "alias"):
        monkeypatch.setattr(inputs, "_PROC_FD", True)
        fast = [_outcome(base, case) for case in cases]
        # the root's real path found once for many inputs, as a batch reads them
        once = inputs.corpus_real_path(base)
        assert once == str(root.resolve())
        batch = [_outcome(base, case, once) for case in cases]
        monkeypatch.setattr(inputs, "_PROC_FD", False)
        slow = [_outcome(base, case) for case in cases]
        assert fast == batch == slow
        assert inputs.corpus_real_path(base) is None  # no /proc: each read resolves
    assert [kind for kind, _ in fast] == [
        "read",
        "read",
        "read",
        "input_invalid",
        "input_invalid",
        "input_invalid",
        "input_invalid",
        "read",
        "input_invalid",
        "input_invalid",
        "input_missing",
        "input_invalid",
        "input_invalid",
        "input_invalid",
    ]
    assert fast[5][1] == "path 'link-out.txt' leaves the corpus folder <root>"
