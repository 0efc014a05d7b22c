"""Batch text generation: a prompt a unit through a local causal language model.

The spec side, without torch: parameters, prompt costs (prompt tokens + the
tokens a prompt may generate, so batches and the profile are sized on the KV
cache, not on the prompts alone), the output check (one JSON object a unit)
and the review rules' parameters. The worker side is
gpuworker/processors/text_generation.py; docs/processors.md, "Built-in:
text-generation", is the user's page.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jinja2
from django.conf import settings
from django.core.exceptions import ValidationError

from campaigns.intake.inputs import InputError, ReadLimits, decode_text, read_bytes
from campaigns.intake.records import carried, parse_locator
from campaigns.models import ErrorClass
from campaigns.review.flags import REPEAT_FLAGS
from campaigns.specs import chat_templates
from campaigns.specs.builtin import (
    model_config,
    model_tokenizer,
    resolve_model_path,
    text_token_costs,
)
from campaigns.specs.limits import MAX_INPUT_BYTES, TEXT_BYTES_PER_TOKEN, max_input_bytes
from campaigns.specs.processors import ParamSpec, ProcessorSpec
from campaigns.storage.outputs import (
    WRONG_OUTPUT,
    InvalidOutput,
    check_json_output_head,
    read_json_output,
)
from campaigns.storage.row_shards import RowReader

#: The fields of every output file, in this order; `finish_reason` is one of
#: FINISH_REASONS. A unit's id is its output's name (and the first column of
#: the export, campaigns/exports).
OUTPUT_FIELDS = ("completion", "finish_reason", "prompt_tokens", "completion_tokens")
#: "stop": the model ended the text (an end-of-sequence token) or wrote a stop
#: string; "length": it was cut at max_new_tokens.
FINISH_REASONS = ("stop", "length")
#: No output of a completion of N tokens is longer than this many bytes a token
#: (a token decodes to a few bytes; JSON escapes at most sextuple them).
OUTPUT_BYTES_PER_TOKEN = 256

#: Phrases that say the model declined (flag_refusals' default), matched case-blind.
DEFAULT_REFUSALS = (
    "I'm sorry, but",
    "I am sorry, but",
    "I cannot help with",
    "I can't help with",
    "I cannot assist",
    "I can't assist",
    "As an AI language model",
    "I'm unable to",
)


#: What a row of a records file may set for its own prompt (`--param-column
#: NAME=COLUMN`); each is checked as the version's parameter is, and a row may
#: lower max_new_tokens, never raise it (the version's bounds the context check
#: and the outputs'). The sampling ones apply under decoding=sample only.
ROW_PARAMS = ("system_prompt", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop")
SAMPLING_PARAMS = ("temperature", "top_p", "top_k", "seed")


def text_list(value: str, name: str) -> list[str]:
    """A parameter holding strings as a JSON list ("" for none): each non-empty."""
    if not value.strip():
        return []
    try:
        items = json.loads(value)
    except ValueError:
        items = None
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise ValidationError(
            f'{name}: a JSON list of non-empty strings, such as ["\\n\\n", "###"]; got {value!r}'
        )
    return items


def prompt_input(data: bytes, params: dict) -> tuple[str, dict]:
    """A prompt's text and the parameters it runs with: the version's, with
    the row's own over them where its record carries some (records.carried);
    a value the row may not have is the unit's input_invalid, said by name."""
    found = carried(data) if not getattr(data, "cut", False) else None
    if found is None:
        return decode_text(data), params
    text, given = found
    row = dict(params)
    for name, value in given.items():
        try:
            row[name] = row_value(name, value, params)
        except ValidationError as exc:
            raise InputError(
                ErrorClass.INPUT_INVALID, f"this row's {name}: {'; '.join(exc.messages)}"
            ) from None
    return decode_text(text.encode("utf-8")), row


def row_value(name: str, value: object, params: dict) -> object:
    """A row's value of a parameter, as the version's would be cleaned."""
    if name not in ROW_PARAMS:
        raise ValidationError(f"not a parameter a row may set ({', '.join(ROW_PARAMS)})")
    if name in SAMPLING_PARAMS and params["decoding"] != "sample":
        raise ValidationError("applies to decoding=sample, and this version decodes greedy")
    if name == "stop":
        if isinstance(value, list):
            value = json.dumps(value, ensure_ascii=False)
        if not isinstance(value, str):
            raise ValidationError(f"a JSON list of strings, got {value!r}")
        text_list(value, "stop")
        return value
    cleaned = TEXT_GENERATION.clean_value(name, value)
    if name == "max_new_tokens" and cleaned > int(params["max_new_tokens"]):
        raise ValidationError(
            f"{cleaned} is over the version's max_new_tokens {params['max_new_tokens']}, "
            "the most a row may ask for"
        )
    return cleaned


def prompt_read_limits(params: dict) -> ReadLimits:
    """A prompt is read as far as max_prompt_tokens can use; a longer one is refused."""
    return ReadLimits(
        keep=int(params["max_prompt_tokens"]) * TEXT_BYTES_PER_TOKEN,
        max_bytes=max_input_bytes(params),
    )


def _cost_params(params: dict) -> dict:
    # text_token_costs reads `model` and caps at `max_tokens`: the prompt's.
    return {**params, "max_tokens": int(params["max_prompt_tokens"])}


SPECIAL_TOKEN_NAMES: tuple[str, ...] = ("bos_token", "eos_token", "unk_token", "sep_token")
SPECIAL_TOKEN_NAMES += ("pad_token", "cls_token", "mask_token")


@functools.lru_cache(maxsize=8)
def chat_form(model: str, chat_template: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """The folder's chat template and the special tokens it may name, as the
    tokenizer saved them (chat_template.jinja, or tokenizer_config.json's
    `chat_template`); None when prompts go as they are (`chat_template=none`,
    or a tokenizer without one)."""
    if chat_template == "none":
        return None
    folder = resolve_model_path(model)
    config: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            read = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(read, dict):
            config.update(read)
    template: object
    try:
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    except OSError:
        template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template.strip():
        return None
    tokens = []
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens.append((name, value))
    return template, tuple(tokens)


def prompt_text(params: dict, text: str) -> tuple[str, bool]:
    """What the model reads for a prompt: the chat template's rendering (a
    system turn when there is a system prompt, the user's turn, the
    assistant's cue), else the system prompt, a blank line and the text;
    and whether the tokenizer adds its own special tokens to it (not to a
    template's, which writes those it wants). The worker and the setup
    page's check both count this."""
    system = params["system_prompt"]
    form = chat_form(params["model"], params["chat_template"])
    if form is None:
        return (f"{system}\n\n{text}" if system else text), True
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    template, tokens = form
    try:
        return chat_templates.render(template, messages, **dict(tokens)), False
    except jinja2.TemplateError as exc:
        # A template that refuses a system turn (some do), or this text:
        # this prompt's failure, not its batch's.
        raise InputError(
            ErrorClass.INPUT_INVALID, f"the model's chat template refuses this prompt: {exc}"
        ) from None


def prompt_tokens(params: dict, text: str, tokenizer=None) -> list[int]:
    """The prompt's token ids as the model reads them (`prompt_text`), by the
    folder's tokenizer.json or `tokenizer` (a `tokenizers.Tokenizer`)."""
    rendered, specials = prompt_text(params, text)
    tokenizer = tokenizer or model_tokenizer(params["model"])
    return tokenizer.encode(rendered, add_special_tokens=specials).ids


_MARKER = "\u2063prompt\u2063"  # invisible separators: in no prompt a user writes


def prompt_cost(path: Path, params: dict) -> int | None:
    return prompt_costs(path.parent, [path.name], params)[0]


def prompt_costs(root: Path, source_paths: list[str], params: dict) -> list[int | None]:
    """Each prompt's tokens as the model reads them, plus max_new_tokens: what
    a prompt costs the KV cache at its longest, so the token budget and the
    profile bound memory by it. The text's tokens are counted on every core
    (text_token_costs); the chat template's or system prompt's, once. A row
    carrying parameters of its own is weighed alone, under them."""
    own = [i for i, path in enumerate(source_paths) if _carries(path)]
    if own:
        costs: list[int | None] = [None] * len(source_paths)
        weighed = _row_prompt_costs(root, [source_paths[i] for i in own], params)
        for i, cost in zip(own, weighed, strict=True):
            costs[i] = cost
        rest = [i for i in range(len(source_paths)) if i not in own]
        weighed = prompt_costs(root, [source_paths[i] for i in rest], params) if rest else []
        for i, cost in zip(rest, weighed, strict=True):
            costs[i] = cost
        return costs
    # The prompt inside what the model reads around it, tokenized together
    # (the seams as the worker's), on every core. A template that changes
    # the text itself (a trim) is counted as if it did not.
    rendered, specials = prompt_text(params, _MARKER)
    before, marker, after = rendered.partition(_MARKER)
    if not marker or _MARKER in after:
        before, after = "", ""
    new = int(params["max_new_tokens"])
    costs = text_token_costs(
        root, source_paths, _cost_params(params), around=(before, after), specials=specials
    )
    return [None if c is None else c + new for c in costs]


def _carries(source_path: str) -> bool:
    located = parse_locator(source_path) if "#" in source_path else None
    return located is not None and bool(located.params)


def _row_prompt_costs(root: Path, source_paths: list[str], params: dict) -> list[int | None]:
    """Rows carrying parameters: each prompt under its own system prompt, in
    tokens capped as the others are, plus the version's max_new_tokens (a
    batch holds its longest prompt and its largest limit, which may be two
    rows', so a row's lower limit cannot make it cheaper). Read as far as
    max_prompt_tokens can use (a longer row costs the most a prompt may);
    None where it cannot be read. Its other values are not looked at: a row
    weighs the same under any version, whatever it is refused for."""
    cap, new = int(params["max_prompt_tokens"]), int(params["max_new_tokens"])
    limits = ReadLimits(keep=prompt_read_limits(params).keep)
    costs: list[int | None] = [None] * len(source_paths)
    rendered: dict[bool, list[tuple[int, str]]] = {True: [], False: []}
    for at, source_path in enumerate(source_paths):
        try:
            data = read_bytes(root, source_path, limits=limits)
            if data.cut:
                costs[at] = cap + new
                continue
            found = carried(data)
            if found is None:
                continue
            text, values = found
            system = values.get("system_prompt")
            row = {**params, "system_prompt": system} if isinstance(system, str) else params
            prompt, specials = prompt_text(row, text)
        except (InputError, ValueError):
            continue
        rendered[specials].append((at, prompt))
    tokenizer = model_tokenizer(params["model"])
    for specials, prompts in rendered.items():
        for start in range(0, len(prompts), 1024):
            chunk = prompts[start : start + 1024]
            encoded = tokenizer.encode_batch([p for _, p in chunk], add_special_tokens=specials)
            for (at, _), encoding in zip(chunk, encoded, strict=True):
                costs[at] = max(1, min(len(encoding.ids), cap)) + new
    return costs


def check_prompt(data: bytes, params: dict) -> str:
    """What the worker's prepare refuses, said by the setup page's preview."""
    size = getattr(data, "size", len(data))
    if size > len(data):
        refuse_long_prompt(0, int(params["max_prompt_tokens"]), cut=True)
    text, row = prompt_input(data, params)
    tokens = len(prompt_tokens(row, text))
    refuse_long_prompt(tokens, int(params["max_prompt_tokens"]))
    return text


def refuse_long_prompt(tokens: int, max_prompt_tokens: int, *, cut: bool = False) -> None:
    if cut or tokens > max_prompt_tokens:
        said = "more than" if cut else str(tokens)
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"{said} {'' if cut else 'tokens, '}over max_prompt_tokens {max_prompt_tokens}"
            + (f" ({max_prompt_tokens} tokens)" if cut else "")
            + ": a prompt is never cut, shorten it or raise max_prompt_tokens",
        )


#: Where a config.json says how many positions the model has.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def validate_generation(params: dict) -> None:
    """A causal language model folder with a fast tokenizer; list parameters parse."""
    text_list(params["stop"], "stop")
    text_list(params["flag_refusals"], "flag_refusals")
    if params["decoding"] == "greedy" and (
        float(params["temperature"]) != 1.0 or float(params["top_p"]) != 1.0 or params["top_k"]
    ):
        raise ValidationError(
            "temperature, top_p and top_k apply to decoding=sample; with greedy leave them at "
            "1, 1 and 0"
        )
    found = model_config(params, tokenizer_for="counting prompt tokens")
    if found is None:
        return
    try:
        prompt_text(params, "a prompt")
    except InputError as exc:
        # Every prompt would fail so (a template that takes no system turn).
        raise ValidationError(f"system_prompt: {exc.message}") from None
    folder, config = found
    if not isinstance(config, dict):
        raise ValidationError(f"model: {folder / 'config.json'} is not a JSON object")
    architectures = config.get("architectures")
    if architectures and not any(str(a).endswith("ForCausalLM") for a in architectures):
        raise ValidationError(
            f"model: {folder} is a {', '.join(map(str, architectures))}, not a causal language "
            "model (AutoModelForCausalLM: an architecture ending in ForCausalLM)"
        )
    # A position past the model's context fails every batch it is in (on a
    # GPU, a device-side assert that stops the worker): said here instead.
    context = next(
        (config[k] for k in CONTEXT_KEYS if isinstance(config.get(k), int) and config[k] > 0), None
    )
    longest = int(params["max_prompt_tokens"]) + int(params["max_new_tokens"])
    if context is not None and longest > context:
        raise ValidationError(
            f"max_prompt_tokens + max_new_tokens = {longest:,}, over the model's context of "
            f"{context:,} tokens (config.json); set max_prompt_tokens to at most "
            f"{max(0, context - int(params['max_new_tokens'])):,}"
        )


def check_completion(record: object, params: dict) -> dict:
    """One output's JSON object as the worker writes it, or InvalidOutput."""
    if not isinstance(record, dict) or tuple(record) != OUTPUT_FIELDS:
        got = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise InvalidOutput(f"fields {got}, expected {', '.join(OUTPUT_FIELDS)}", WRONG_OUTPUT)
    if not isinstance(record["completion"], str):
        raise InvalidOutput("completion must be text", WRONG_OUTPUT)
    if record["finish_reason"] not in FINISH_REASONS:
        raise InvalidOutput(f"finish_reason {record['finish_reason']!r}", WRONG_OUTPUT)
    for name in ("prompt_tokens", "completion_tokens"):
        if not isinstance(record[name], int) or isinstance(record[name], bool) or record[name] < 0:
            raise InvalidOutput(f"{name} {record[name]!r} is not a count", WRONG_OUTPUT)
    if record["completion_tokens"] > int(params["max_new_tokens"]):
        raise InvalidOutput(
            f"{record['completion_tokens']} completion tokens, over max_new_tokens "
            f"{params['max_new_tokens']}",
            WRONG_OUTPUT,
        )
    return record


def longest_output(params: dict) -> int:
    """No output of these parameters is longer than this many bytes."""
    return (int(params["max_new_tokens"]) + 64) * OUTPUT_BYTES_PER_TOKEN + 4096


def read_completion(path: Path, params: dict) -> dict:
    """An output file read (bounded by what max_new_tokens can make) and checked."""
    return check_completion(read_json_output(path, longest_output(params), "completion"), params)


def completion_reader(params: dict) -> RowReader:
    """What reads completions by output path (a line of a batch's row shard,
    or a file a unit), for `read_completion_at`."""
    return RowReader(settings.OUTPUT_ROOT, longest_output(params))


def read_completion_at(reader: RowReader, rel: str, params: dict, uid: str | None = None) -> dict:
    """A unit's completion by its output path, checked; OSError or InvalidOutput."""
    return check_completion(reader.record(rel, uid), params)


def _record_check(record: dict, params: dict) -> None:
    check_completion(record, params)


def _quick_check(path: Path, expected_size: int | None, params: dict) -> None:
    check_json_output_head(path, expected_size)


def _deep_check(path: Path, params: dict) -> None:
    read_completion(path, params)


GENERATION_FLAGS = {
    "flag_length": ParamSpec(
        "yes",
        choices=("yes", "no"),
        help="flag a completion cut at max_new_tokens (finish_reason length)",
    ),
    **REPEAT_FLAGS,
    "flag_refusals": ParamSpec(
        json.dumps(list(DEFAULT_REFUSALS)),
        help="a JSON list of phrases: a completion holding one (case-blind) is flagged "
        "as a refusal ([]: never)",
    ),
}

TEXT_GENERATION = ProcessorSpec(
    name="text-generation",
    title="Text generation",
    help="A completion per prompt from a local Hugging Face causal language model.",
    output_suffix=".json",
    implementation="gpuworker.processors.text_generation:TextGenerationProcessor",
    padding="longest",
    takes_text=True,
    row_params=ROW_PARAMS,
    model_params=("model",),
    params={
        "model": ParamSpec(
            "",
            required=True,
            help="a local Hugging Face causal language model folder (AutoModelForCausalLM, "
            "with its tokenizer.json)",
        ),
        "system_prompt": ParamSpec(
            "", help="sent before every prompt (as the system message under a chat template)"
        ),
        "chat_template": ParamSpec(
            "auto",
            choices=("auto", "none"),
            help="auto: prompts go through the tokenizer's chat template when it has one; "
            "none: the prompt text as it is",
        ),
        "max_new_tokens": ParamSpec(
            128, type=int, minimum=1, maximum=32768, help="tokens a completion may have"
        ),
        "max_prompt_tokens": ParamSpec(
            2048,
            type=int,
            minimum=1,
            maximum=1_000_000,
            help="a longer prompt fails input_invalid (prompts are never cut)",
        ),
        "decoding": ParamSpec(
            "greedy",
            choices=("greedy", "sample"),
            help="greedy: the likeliest token each step; sample: drawn with a seed per prompt, "
            "so a rerun writes the same text",
        ),
        "temperature": ParamSpec(1.0, type=float, minimum=0.01, maximum=100),
        "top_p": ParamSpec(1.0, type=float, minimum=0.01, maximum=1),
        "top_k": ParamSpec(0, type=int, minimum=0, help="sample among this many tokens (0: all)"),
        "seed": ParamSpec(
            0, type=int, minimum=0, help="sample: each prompt's draws start from this and its text"
        ),
        "stop": ParamSpec(
            "",
            help='a JSON list of strings ending a completion where one appears, e.g. ["\\n\\n"]; '
            "the completion is kept up to it",
        ),
        "dtype": ParamSpec(
            "float32",
            choices=("float32", "float16", "bfloat16"),
            help="model precision; float16 and bfloat16 need a CUDA worker",
        ),
        "batch_size": ParamSpec(
            8, type=int, minimum=1, maximum=4096, help="prompts per batch (length_grouped)"
        ),
        "batch_policy": ParamSpec(
            "token_budget",
            choices=("token_budget", "length_grouped", "original"),
            help="token_budget: prompts sorted by length, as many a batch as "
            "prompts × (longest prompt + max_new_tokens) allows; length_grouped: sorted, "
            "batch_size at a time; original: import order",
        ),
        "token_budget": ParamSpec(
            16384,
            type=int,
            minimum=16,
            maximum=100_000_000,
            help="token_budget: prompts × (longest prompt + max_new_tokens) per batch",
        ),
        "max_input_bytes": MAX_INPUT_BYTES,
        **GENERATION_FLAGS,
    },
    quick_check=_quick_check,
    deep_check=_deep_check,
    record_check=_record_check,
    cost=prompt_cost,
    costs=prompt_costs,
    cost_params=("model", "max_new_tokens", "max_prompt_tokens", "system_prompt", "chat_template"),
    check_input=check_prompt,
    validate=validate_generation,
    read_limits=prompt_read_limits,
)
