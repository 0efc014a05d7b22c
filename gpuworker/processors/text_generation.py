"""Batch text generation with a local Hugging Face causal language model.

A unit is a prompt (a text file, or a row of a records file); its output is
one JSON object (campaigns.specs.generation.OUTPUT_FIELDS). Prompts of a
batch are padded on the left, so every row's new tokens start at the same
step; a row that ends (an end-of-sequence token, a stop string) is padded
until the others end. Greedy decoding gives a prompt the same text in any
batch; sampling draws each prompt's tokens from a generator of its own,
seeded by the version's seed and the prompt's bytes, so a rerun (a resumed
unit, another batch composition) writes the same text too.
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

from campaigns.intake.inputs import InputError, decode_text
from campaigns.models import ErrorClass
from campaigns.review.flags import completion_flags
from campaigns.specs.builtin import resolve_model_path
from campaigns.specs.generation import (
    prompt_tokens,
    read_completion,
    refuse_long_prompt,
    text_list,
)
from campaigns.storage import checkpoint_files as checkpoints
from gpuworker.memory import MemoryProbe, device_and_dtype
from gpuworker.processors.text_embedding import folder_stamp


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # the tokens the model reads, chat template and system prompt included
    seed: int  # sampling's seed for this prompt


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


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
    seed and logits only, never on the batch it is in. It leaves one token
    possible a row, which greedy search then takes."""

    def __init__(self, seeds: list[int], temperature: float, top_k: int, top_p: float):
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float().cpu() / self.temperature
        if self.top_k:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1:
            ordered, order = torch.sort(probs, descending=True)
            # A token stays while the mass before it is under top_p: the first always does.
            drop = (ordered.cumsum(dim=-1) - ordered) >= self.top_p
            ordered = ordered.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, ordered)
        draws = zip(probs, self.generators, strict=True)
        chosen = [int(torch.multinomial(row, 1, generator=g)) for row, g in draws]
        picked = torch.full_like(scores, float("-inf"))
        picked[torch.arange(len(chosen)), torch.tensor(chosen)] = 0.0
        return cast(torch.FloatTensor, picked)


class StopStrings(StoppingCriteria):
    """Ends a row once its generated text holds a stop string, and keeps the
    step: the prompt is not looked at (a prompt ending in the stop string
    would end every completion at its first token), nor a row that already
    ended with an end token (its padding)."""

    def __init__(self, tokenizer, stops: list[str], width: int, eos: list[int]):
        self.tokenizer, self.stops, self.width, self.eos = tokenizer, stops, width, set(eos)
        # A stop string is completed by the last token: decoding the last few
        # tokens (at least one character each, as a rule) finds it.
        self.tail = max(len(stop) for stop in stops) + 8
        self.ended: dict[int, int] = {}  # row -> index of the token that completed a stop

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs):
        generated = input_ids[:, self.width :].tolist()
        done = []
        for row, tokens in enumerate(generated):
            if row in self.ended or self.eos.intersection(tokens):
                done.append(row in self.ended)
                continue
            text = self.tokenizer.decode(tokens[-self.tail :], skip_special_tokens=False)
            if any(stop in text for stop in self.stops):
                self.ended[row] = len(tokens) - 1
                done.append(True)
            else:
                done.append(False)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class TextGenerationProcessor:
    suffix = ".json"

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
        text = decode_text(data)
        limit = int(self.params["max_prompt_tokens"])
        if getattr(data, "size", len(data)) > len(data):
            refuse_long_prompt(0, limit, cut=True)
        ids = prompt_tokens(self.params, text, self.counter)
        if not ids:
            raise InputError(ErrorClass.INPUT_INVALID, "no tokens: nothing to prompt with")
        refuse_long_prompt(len(ids), limit)
        digest = hashlib.sha256(f"{self.params['seed']}:".encode() + bytes(data)).digest()
        return Prompt(ids=ids, seed=int.from_bytes(digest[:8], "big") >> 1)

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

    def unit_metrics(self, result: GenerationBatch, index: int) -> dict:
        done = result.completions[index]
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "finish_reason": done.finish_reason,
        }

    def flags(self, result: GenerationBatch, index: int) -> list[tuple[str, str]]:
        done = result.completions[index]
        return completion_flags(done.text, done.finish_reason, self.params)

    def batch_metrics(self, result: GenerationBatch) -> dict:
        prompt = sum(c.prompt_tokens for c in result.completions)
        generated = sum(c.completion_tokens for c in result.completions)
        return {
            # In the units' costs (prompt + max_new_tokens each), as the
            # estimate, the profile and the time left count the work; the
            # tokens generated are said apart.
            "real_tokens": prompt + len(result.completions) * self.max_new_tokens,
            "padded_tokens": result.padded_tokens,
            "compute_seconds": round(result.seconds, 4),
            "prompt_tokens": prompt,
            "generated_tokens": generated,
            "memory": result.memory,
        }

    # --- the model ----------------------------------------------------------

    def _config(self, longest: bool = False) -> GenerationConfig:
        # Every setting that changes the text is the version's: a value left
        # unset would be taken from the model folder's generation_config.json
        # (a repetition penalty, sampling), not from the parameters.
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=self.max_new_tokens if longest else 0,
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
            processors.append(
                SeededSampler(
                    [p.seed for p in prompts],
                    float(self.params["temperature"]),
                    int(self.params["top_k"]),
                    float(self.params["top_p"]),
                )
            )
        stops = StoppingCriteriaList()
        if self.stops and not longest:
            stops.append(StopStrings(self.tokenizer, self.stops, width, self.eos))
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=self._config(longest),
            logits_processor=processors,
            stopping_criteria=stops,
        )
        new = out[:, width:].cpu().tolist()
        memory = self.probe.snapshot()
        ended = stops[0].ended if stops else {}
        completions = [
            self._completion(p, tokens, ended.get(row))
            for row, (p, tokens) in enumerate(zip(prompts, new, strict=True))
        ]
        return GenerationBatch(
            completions=completions,
            # In the units' costs: every row may hold its prompt's width and max_new_tokens.
            padded_tokens=len(prompts) * (width + self.max_new_tokens),
            seconds=time.perf_counter() - started,
            memory=memory,
        )

    def _completion(self, prompt: Prompt, tokens: list[int], stop_at: int | None) -> Completion:
        """One row's new tokens up to where it ended (its end token, or the
        token that completed a stop string: `stop_at`), decoded; the text cut
        before the stop string. A row that ended before the others is padded."""
        ended = next((at for at, t in enumerate(tokens) if t in self.eos), None)
        if stop_at is not None and (ended is None or stop_at < ended):
            # Decoded with its special tokens, so a stop string that is one
            # (a chat model's end-of-turn marker) is found; their texts are
            # then taken out of the part kept, as skip_special_tokens would.
            raw = self.tokenizer.decode(tokens[: stop_at + 1], skip_special_tokens=False)
            cut = min((at for at in (raw.find(s) for s in self.stops) if at >= 0), default=len(raw))
            text = raw[:cut]
            for special in self.tokenizer.all_special_tokens:
                text = text.replace(special, "")
            return Completion(text, "stop", len(prompt.ids), stop_at + 1)
        if ended is not None:
            text = self.tokenizer.decode(tokens[:ended], skip_special_tokens=True)
            # The end token is generated too.
            return Completion(text, "stop", len(prompt.ids), ended + 1)
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(text, "length", len(prompt.ids), len(tokens))


def completion_bytes(completion: Completion) -> bytes:
    """The output file: one JSON object, fields in OUTPUT_FIELDS' order."""
    return json.dumps(
        {
            "completion": completion.text,
            "finish_reason": completion.finish_reason,
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
        },
        ensure_ascii=False,
    ).encode("utf-8")
