"""Batch text generation with a local Hugging Face causal language model.

A unit is a prompt (a text file, or a row of a records file); its output is
one JSON object (campaigns.specs.generation.OUTPUT_FIELDS), a line of its
batch's JSON Lines shard (campaigns/storage/row_shards.py). Prompts of a
batch are padded on the left, so every row's new tokens start at the same
step; a row that ends (an end-of-sequence token, a stop string) is padded
until the others end. Greedy decoding gives a prompt the same text in any
batch; sampling draws each prompt's tokens from a generator of its own,
seeded by the version's seed and the prompt's bytes, so a rerun (a resumed
unit, another batch composition) writes the same text too. A row of a records
file may carry its own system prompt, max_new_tokens, sampling settings, seed
and stop strings (campaigns.specs.generation.ROW_PARAMS): each row of a batch
is decoded under its own, and ends at its own max_new_tokens.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from tokenizers import Tokenizer
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from campaigns.intake.inputs import InputError
from campaigns.models import ErrorClass
from campaigns.review.flags import completion_flags
from campaigns.specs.builtin import resolve_model_path
from campaigns.specs.generation import (
    check_completion,
    prompt_input,
    prompt_tokens,
    read_completion,
    refuse_long_prompt,
    text_list,
)
from campaigns.storage import checkpoint_files as checkpoints
from campaigns.storage.outputs import InvalidOutput
from gpuworker.memory import MemoryProbe, device_and_dtype
from gpuworker.processors.text_embedding import folder_stamp


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # the tokens the model reads, chat template and system prompt included
    seed: int  # sampling's seed for this prompt
    # The parameters it is decoded under: the version's, or its row's own.
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stops: tuple[str, ...] = ()


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    max_new_tokens: int  # the most it could have had (its row's, or the version's)


@dataclass
class GenerationBatch:
    completions: list[Completion]
    padded_tokens: int
    seconds: float
    memory: dict


@functools.lru_cache(maxsize=2)
def load_generator(path: str, _stamp: tuple, device: torch.device, dtype: torch.dtype):
    """(tokenizer, model) of a folder, once per worker process, folder
    contents and precision: versions that differ in decoding or flags share
    the weights."""
    folder = Path(path)
    if (folder / checkpoints.SIDECAR).exists():
        checkpoints.verified(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
    # Of the folder's generation_config.json only its special tokens are
    # kept: every setting left unset in a call is taken from it (a repetition
    # penalty, suppressed tokens, a return type, stop strings), and the
    # version's parameters alone decide the text.
    kept = model.generation_config
    model.generation_config = GenerationConfig(
        bos_token_id=kept.bos_token_id,
        eos_token_id=kept.eos_token_id,
        pad_token_id=kept.pad_token_id,
    )
    return tokenizer, model.to(device).eval()


class SeededSampler(LogitsProcessor):
    """Sampling with a generator a row: each row's draw depends on its own
    seed, settings and logits only, never on the batch it is in. It leaves
    one token possible a row, which greedy search then takes."""

    def __init__(self, prompts: list[Prompt]):
        self.generators = [torch.Generator().manual_seed(p.seed) for p in prompts]
        self.settings = [(p.temperature, p.top_k, p.top_p) for p in prompts]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float().cpu()
        chosen = []
        for row, (generator, (temperature, top_k, top_p)) in enumerate(
            zip(self.generators, self.settings, strict=True)
        ):
            probs = _row_probabilities(logits[row] / temperature, top_k, top_p)
            chosen.append(int(torch.multinomial(probs, 1, generator=generator)))
        picked = torch.full_like(scores, float("-inf"))
        picked[torch.arange(len(chosen)), torch.tensor(chosen)] = 0.0
        return cast(torch.FloatTensor, picked)


def _row_probabilities(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """One row's sampling distribution: its top_k tokens, then those within top_p."""
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1:
        ordered, order = torch.sort(probs, descending=True)
        # A token stays while the mass before it is under top_p: the first always does.
        drop = (ordered.cumsum(dim=-1) - ordered) >= top_p
        ordered = ordered.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
    return probs


class RowLimits(StoppingCriteria):
    """Ends each row at its own max_new_tokens (a row's may be under the batch's)."""

    def __init__(self, limits: list[int], width: int):
        self.limits, self.width = torch.tensor(limits), width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs):
        done = self.limits <= input_ids.shape[1] - self.width
        return done.to(input_ids.device)


class StopStrings(StoppingCriteria):
    """Ends a row once its generated text holds one of its stop strings, and
    keeps the step: the prompt is not looked at (a prompt ending in the stop
    string would end every completion at its first token), nor a row that
    already ended with an end token (its padding)."""

    def __init__(self, tokenizer, stops: list[tuple[str, ...]], width: int, eos: list[int]):
        self.tokenizer, self.stops, self.width, self.eos = tokenizer, stops, width, set(eos)
        # A stop string is completed by the last token: decoding the last few
        # tokens (at least one character each, as a rule) finds it.
        self.tails = [max((len(stop) for stop in row), default=0) + 8 for row in stops]
        self.ended: dict[int, int] = {}  # row -> index of the token that completed a stop

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs):
        generated = input_ids[:, self.width :].tolist()
        done = []
        for row, tokens in enumerate(generated):
            if row in self.ended or self.eos.intersection(tokens) or not self.stops[row]:
                done.append(row in self.ended)
                continue
            text = self.tokenizer.decode(tokens[-self.tails[row] :], skip_special_tokens=False)
            if any(stop in text for stop in self.stops[row]):
                self.ended[row] = len(tokens) - 1
                done.append(True)
            else:
                done.append(False)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class TextGenerationProcessor:
    suffix = ".json"
    # A batch's completions go into one JSON Lines shard, a line a unit.
    row_outputs = True

    def __init__(self, params: dict):
        self.params = params
        self.max_new_tokens = int(params["max_new_tokens"])
        self.device, dtype = device_and_dtype(params["dtype"])
        folder = resolve_model_path(params["model"])
        self.tokenizer, self.model = load_generator(
            str(folder), folder_stamp(folder), self.device, dtype
        )
        self.stops = text_list(params["stop"], "stop")
        config = self.model.generation_config
        eos = config.eos_token_id if config.eos_token_id is not None else []
        eos = [eos] if isinstance(eos, int) else list(eos)
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos = eos
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = config.pad_token_id if config.pad_token_id is not None else (eos or [0])[0]
        self.pad = int(pad)
        # Counting in prepare with a tokenizer of its own, as the setup page
        # counts (campaigns.specs.generation.prompt_tokens): prepare runs in
        # reader threads while run() may be using the transformers tokenizer.
        self.counter = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        self.counter.no_truncation()
        self.counter.no_padding()
        self.probe = MemoryProbe(self.device)

    # --- the interface the batch runner uses ------------------------------

    def prepare(self, data: bytes) -> Prompt:
        limit = int(self.params["max_prompt_tokens"])
        if getattr(data, "size", len(data)) > len(data):
            refuse_long_prompt(0, limit, cut=True)
        text, row = prompt_input(data, self.params)
        ids = prompt_tokens(row, text, self.counter)
        if not ids:
            raise InputError(ErrorClass.INPUT_INVALID, "no tokens: nothing to prompt with")
        refuse_long_prompt(len(ids), limit)
        # Seeded by the seed and the prompt: its file's bytes, or its row's text.
        said = bytes(data) if row is self.params else text.encode("utf-8")
        digest = hashlib.sha256(f"{row['seed']}:".encode() + said).digest()
        stops = self.stops if row["stop"] == self.params["stop"] else text_list(row["stop"], "stop")
        return Prompt(
            ids=ids,
            seed=int.from_bytes(digest[:8], "big") >> 1,
            max_new_tokens=int(row["max_new_tokens"]),
            temperature=float(row["temperature"]),
            top_k=int(row["top_k"]),
            top_p=float(row["top_p"]),
            stops=tuple(stops),
        )

    def run(self, items: list[Prompt]) -> GenerationBatch:
        return self.generate(items)

    def run_longest(self, items: list[Prompt]) -> GenerationBatch:
        """`run` at its most memory: every prompt generates max_new_tokens
        (no end token, no stop string), so the KV cache reaches what the
        batch may hold. The profiler measures this (gpuworker/profiler.py)."""
        return self.generate(items, longest=True)

    def output(self, result: GenerationBatch, index: int) -> Completion:
        return result.completions[index]

    def serialize(self, completion: Completion) -> bytes:
        return completion_bytes(completion)

    def validate(self, path: Path) -> None:
        read_completion(path, self.params)

    def row_record(self, completion: Completion) -> dict:
        return completion_record(completion)

    def check_record(self, record: dict) -> InvalidOutput | None:
        try:
            check_completion(record, self.params)
        except InvalidOutput as exc:
            return exc
        return None

    def unit_metrics(self, result: GenerationBatch, index: int) -> dict:
        done = result.completions[index]
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "finish_reason": done.finish_reason,
        }

    def flags(self, result: GenerationBatch, index: int) -> list[tuple[str, str]]:
        done = result.completions[index]
        # Cut at its own limit (its row's, or the version's).
        params = {**self.params, "max_new_tokens": done.max_new_tokens}
        return completion_flags(done.text, done.finish_reason, params)

    def batch_metrics(self, result: GenerationBatch) -> dict:
        prompt = sum(c.prompt_tokens for c in result.completions)
        generated = sum(c.completion_tokens for c in result.completions)
        return {
            # In the units' costs (prompt + the version's max_new_tokens
            # each), as the estimate, the profile and the time left count the
            # work; the tokens generated are said apart.
            "real_tokens": prompt + len(result.completions) * self.max_new_tokens,
            "padded_tokens": result.padded_tokens,
            "compute_seconds": round(result.seconds, 4),
            "prompt_tokens": prompt,
            "generated_tokens": generated,
            "memory": result.memory,
        }

    # --- the model ----------------------------------------------------------

    def _config(self, new_tokens: int, longest: bool = False) -> GenerationConfig:
        # Every setting that changes the text is the version's (or its rows'):
        # a value left unset would be taken from the model folder's
        # generation_config.json (a repetition penalty, sampling), not from
        # the parameters.
        return GenerationConfig(
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens if longest else 0,
            do_sample=False,
            num_beams=1,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=self.eos or None,
            pad_token_id=self.pad,
        )

    @torch.inference_mode()
    def generate(self, prompts: list[Prompt], longest: bool = False) -> GenerationBatch:
        started = time.perf_counter()
        self.probe.reset_peak()
        width = max(len(p.ids) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt.ids) :] = torch.tensor(prompt.ids)
            mask[row, width - len(prompt.ids) :] = 1
        processors = LogitsProcessorList()
        if self.params["decoding"] == "sample":
            processors.append(SeededSampler(prompts))
        # The profile's run (longest) generates the version's max_new_tokens
        # in every row, past any end, row limit or stop.
        new_tokens = self.max_new_tokens if longest else max(p.max_new_tokens for p in prompts)
        stops = StoppingCriteriaList()
        stop_strings = None
        if not longest and any(p.stops for p in prompts):
            stop_strings = StopStrings(self.tokenizer, [p.stops for p in prompts], width, self.eos)
            stops.append(stop_strings)
        if not longest and any(p.max_new_tokens < new_tokens for p in prompts):
            stops.append(RowLimits([p.max_new_tokens for p in prompts], width))
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=self._config(new_tokens, longest),
            logits_processor=processors,
            stopping_criteria=stops,
        )
        new = out[:, width:].cpu().tolist()
        memory = self.probe.snapshot()
        ended = stop_strings.ended if stop_strings is not None else {}
        completions = [
            self._completion(p, tokens, ended.get(row), longest)
            for row, (p, tokens) in enumerate(zip(prompts, new, strict=True))
        ]
        return GenerationBatch(
            completions=completions,
            # In the units' costs: every row may hold the batch's width and max_new_tokens.
            padded_tokens=len(prompts) * (width + self.max_new_tokens),
            seconds=time.perf_counter() - started,
            memory=memory,
        )

    def _completion(
        self, prompt: Prompt, tokens: list[int], stop_at: int | None, longest: bool = False
    ) -> Completion:
        """One row's new tokens up to where it ended (its end token, the token
        that completed a stop string: `stop_at`, or its own max_new_tokens),
        decoded; the text cut before the stop string. A row that ended before
        the others is padded."""
        budget = self.max_new_tokens if longest else prompt.max_new_tokens
        tokens = tokens[:budget]
        ended = next((at for at, t in enumerate(tokens) if t in self.eos), None)
        made = functools.partial(Completion, prompt_tokens=len(prompt.ids), max_new_tokens=budget)
        if stop_at is not None and stop_at < len(tokens) and (ended is None or stop_at < ended):
            # Decoded with its special tokens, so a stop string that is one
            # (a chat model's end-of-turn marker) is found; their texts are
            # then taken out of the part kept, as skip_special_tokens would.
            raw = self.tokenizer.decode(tokens[: stop_at + 1], skip_special_tokens=False)
            found = (raw.find(s) for s in prompt.stops)
            text = raw[: min((at for at in found if at >= 0), default=len(raw))]
            for special in self.tokenizer.all_special_tokens:
                text = text.replace(special, "")
            return made(text=text, finish_reason="stop", completion_tokens=stop_at + 1)
        if ended is not None:
            text = self.tokenizer.decode(tokens[:ended], skip_special_tokens=True)
            # The end token is generated too.
            return made(text=text, finish_reason="stop", completion_tokens=ended + 1)
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return made(text=text, finish_reason="length", completion_tokens=len(tokens))


def completion_record(completion: Completion) -> dict:
    """The output's fields, in OUTPUT_FIELDS' order."""
    return {
        "completion": completion.text,
        "finish_reason": completion.finish_reason,
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
    }


def completion_bytes(completion: Completion) -> bytes:
    """One output as a file of its own: one JSON object."""
    return json.dumps(completion_record(completion), ensure_ascii=False).encode("utf-8")
