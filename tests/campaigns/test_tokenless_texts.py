"""Texts the model's tokenizer reduces to nothing — combining marks or variation
selectors alone — are refused like whitespace-only ones: they would embed as the
special tokens alone, one and the same vector for every such file. The rule
follows the tokenizer: a model that keeps a character embeds it."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, normalizers
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from campaigns.intake.inputs import InputError
from campaigns.specs.limits import refuse_without_tokens
from campaigns.specs.processors import get_spec

TOKENLESS = [
    "\u0301\u0301",  # combining acute accents: all-MiniLM strips accents
    "\ufe0f",  # variation selector-16
    "\u0301\n\ufe0e \u200b",  # marks, a selector, whitespace and a zero-width space
    "\U000e0100" * 3,  # variation selectors supplement
]
KEPT = ["e\u0301", "\u2764\ufe0f", "\u20dd", "x"]  # é decomposed, a heart, an enclosing circle


def _text_check(text: str) -> str:
    spec = get_spec("text-embedding")
    return spec.check_input(text.encode(), spec.clean({}))


@pytest.mark.parametrize("text", TOKENLESS)
def test_the_setup_check_refuses_a_text_the_real_tokenizer_drops_whole(text):
    with pytest.raises(InputError) as info:
        _text_check(text)
    assert info.value.error_class == "input_invalid"
    assert "nothing to embed" in info.value.message
    assert "U+" in info.value.message  # which characters, named


@pytest.mark.parametrize("text", KEPT)
def test_the_setup_check_reads_a_text_with_a_token(text):
    assert _text_check(text) == text


def _tiny_tokenizer(*, strip_accents: bool) -> Tokenizer:
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "\u0301": 1, "e": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    if strip_accents:
        tokenizer.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()])
    return tokenizer


def test_the_rule_follows_the_tokenizer_a_model_that_keeps_a_mark_embeds_it():
    # a tokenizer with the mark in its vocabulary keeps it: nothing refused
    refuse_without_tokens("\u0301\u0301", _tiny_tokenizer(strip_accents=False))
    # one that strips accents drops it: refused, with the character named
    with pytest.raises(InputError, match="U\\+0301") as info:
        refuse_without_tokens("\u0301\u0301", _tiny_tokenizer(strip_accents=True))
    assert info.value.error_class == "input_invalid"
    # an unknown letter is a token all the same ([UNK]): never refused
    refuse_without_tokens("\u0436", _tiny_tokenizer(strip_accents=True))
