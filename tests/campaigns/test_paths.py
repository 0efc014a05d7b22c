from __future__ import annotations

from pathlib import Path

import pytest

from campaigns.storage.paths import normalise_uid, output_relpath, resolve_input, safe_name


def test_uid_is_the_normalised_relative_path():
    assert normalise_uid("./news//a.txt") == "news/a.txt"
    assert normalise_uid("news\\a.txt") == "news/a.txt"
    # NFD "é" (e + combining accent) and NFC "é" are the same id.
    assert normalise_uid("cafe\u0301.txt") == normalise_uid("caf\u00e9.txt")


def test_safe_name_keeps_unicode_readable_and_strips_path_tricks():
    name = safe_name("../../etc/passwd")
    assert "/" not in name and ".." not in name
    assert safe_name("日本語/テキスト.txt").startswith("日本語_テキスト.txt-")


def test_ids_that_read_alike_still_get_different_names():
    assert safe_name("a/b") != safe_name("a_b")


def test_over_long_ids_are_shortened_but_stay_unique():
    a, b = "x" * 500 + "1", "x" * 500 + "2"
    assert len(safe_name(a)) < 100
    assert safe_name(a) != safe_name(b)


def test_output_path_is_deterministic_sharded_and_versioned():
    one = output_relpath(campaign="c", version_label="v1-aa", uid="news/a.txt", suffix=".npy")
    again = output_relpath(campaign="c", version_label="v1-aa", uid="news/a.txt", suffix=".npy")
    other_version = output_relpath(
        campaign="c", version_label="v2-bb", uid="news/a.txt", suffix=".npy"
    )
    assert one == again
    assert one.parts[:2] == ("c", "v1-aa")
    assert len(one.parts[2]) == 2  # shard folder
    assert other_version.parent != one.parent
    assert not Path(one).is_absolute()


def test_inputs_outside_the_corpus_folder_are_refused(tmp_path):
    (tmp_path / "corpus").mkdir()
    root = tmp_path / "corpus"
    assert resolve_input(root, "a.txt") == root.resolve() / "a.txt"
    with pytest.raises(ValueError, match="leaves the corpus folder"):
        resolve_input(root, "../secret.txt")
    with pytest.raises(ValueError, match="leaves the corpus folder"):
        resolve_input(root, "/etc/passwd")
