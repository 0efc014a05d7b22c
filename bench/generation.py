"""Batch text generation: our text-generation campaign beside a plain
`model.generate` loop over the same prompts, in one run.

    DEBUG=0 .venv/bin/python bench/generation.py --limit 256 --max-new-tokens 64

Both sides use the same model (a Llama of `--hidden` × `--layers`, random
weights, made here and saved as a user's folder: no model is downloaded),
the same prompts (the corpus's texts, cut to 8–64 words), greedy decoding,
the same batch size and max_new_tokens. The plain loop is what a user writes
first: prompts in file order, `batch_size` at a time, left padding. Ours is a
campaign over the same prompts as records (a JSONL file) whose batches run
through the worker's own path (`run_batch`: claim, read, prepare, generate,
write and check each completion, record), with length-grouped batches, its
completions a JSON Lines shard a batch; "a file a unit" is the same campaign
writing each completion to a file of its own, as the worker did before
shards (the peer of the shard). "sorted loop" is the plain loop over prompts
sorted by length: what grouping alone is worth.

Reported: generated tokens/s (until each prompt's end token or
max_new_tokens) and prompts/s, wall time; rounds alternate the contenders and
the best of each is kept. Results go in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import logging
import os
import platform
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env  # noqa: E402
from bench.corpus import DEFAULT_CORPUS, read_texts  # noqa: E402


def prompts_of(texts: list[str], limit: int) -> list[str]:
    """Prompts of 8 to 64 words, in the corpus's order."""
    prompts = []
    for i, text in enumerate(texts[:limit]):
        words = text.split() or ["empty"]
        prompts.append(" ".join(words[: 8 + (i * 37) % 57]))
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="cProfile our last round's batches")
    args = parser.parse_args()

    work = django_env.setup("bench-generation-")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from campaigns.intake.records import RecordColumns
    from campaigns.models import Batch
    from campaigns.runs import setup, start
    from gpuworker.runner.batch import run_batch
    from tests.generation import tiny_causal_lm

    logging.getLogger("gpuworker").setLevel(logging.WARNING)
    logging.getLogger("campaigns.runs.recording").setLevel(logging.WARNING)
    model_folder = tiny_causal_lm(work / "model", hidden=args.hidden, layers=args.layers)
    prompts = prompts_of(read_texts(args.corpus, args.limit), args.limit)
    records = work / "prompts.jsonl"
    records.write_text(
        "".join(json.dumps({"id": f"p{i:05d}", "prompt": p}) + "\n" for i, p in enumerate(prompts))
    )
    tokenizer = AutoTokenizer.from_pretrained(model_folder, local_files_only=True)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_folder, local_files_only=True).eval()
    eos = tokenizer.eos_token_id
    project = setup.project_for_user(name="bench")

    def plain(ordered: list[str]) -> tuple[float, int]:
        generated = 0
        started = time.perf_counter()
        for at in range(0, len(ordered), args.batch_size):
            encoded = tokenizer(
                ordered[at : at + args.batch_size], return_tensors="pt", padding=True
            )
            with torch.inference_mode():
                out = model.generate(
                    **encoded,
                    max_new_tokens=args.max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
            for row in out[:, encoded["input_ids"].shape[1] :].tolist():
                generated += next((i + 1 for i, t in enumerate(row) if t == eos), len(row))
        return time.perf_counter() - started, generated

    by_length = sorted(prompts, key=lambda p: len(tokenizer(p)["input_ids"]))
    runs = {"ours": 0}
    host: dict[str, float] = {}

    def ours(name: str, shards: bool = True) -> tuple[float, int]:
        from gpuworker.processors.text_generation import TextGenerationProcessor

        TextGenerationProcessor.row_outputs = shards
        runs["ours"] += 1
        campaign, _ = setup.campaign_create(
            checkpoint_after=0,
            name=f"gen-{runs['ours']}",
            processor="text-generation",
            project=project,
            records=records,
            columns=RecordColumns(text="prompt", id="id"),
            params={
                "model": str(model_folder),
                "max_new_tokens": args.max_new_tokens,
                "batch_policy": "length_grouped",
                "batch_size": args.batch_size,
            },
        )
        start.campaign_run(campaign=campaign)
        pks = list(
            Batch.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True)
        )
        profiler = cProfile.Profile() if args.profile and runs["ours"] == args.rounds else None
        started = time.perf_counter()
        with profiler or contextlib.nullcontext():
            for pk in pks:
                run_batch(pk)
        seconds = time.perf_counter() - started
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(35)
        batches = Batch.objects.filter(campaign=campaign)
        generated = sum(b.metrics.get("generated_tokens", 0) for b in batches)
        model_seconds = sum(b.compute_seconds or 0 for b in batches)
        print(f"    of which in generate: {model_seconds:.2f} s", flush=True)
        host[name] = min(host.get(name, seconds), seconds - model_seconds)
        # A random model's completions run to max_new_tokens: flagged for
        # review (needs_review), their outputs written all the same.
        done = campaign.units.filter(state__in=("succeeded", "needs_review")).count()
        if done != len(prompts):
            said = campaign.units.exclude(state__in=("succeeded", "needs_review")).values_list(
                "state", "error_message"
            )
            raise SystemExit(f"ours: {done} of {len(prompts)} prompts succeeded: {said[:3]}")
        return seconds, generated

    contenders = {
        "plain generate loop": lambda: plain(prompts),
        "sorted generate loop": lambda: plain(by_length),
        "text-generation campaign": lambda: ours("text-generation campaign"),
        "text-generation campaign, a file a unit": lambda: ours(
            "text-generation campaign, a file a unit", shards=False
        ),
    }
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            seconds, generated = run()
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, generated)
            print(f"  {name}: {seconds:.2f} s, {generated} tokens", flush=True)
    print(
        f"\n{len(prompts)} prompts, max_new_tokens {args.max_new_tokens}, batch {args.batch_size}, "
        f"Llama {args.hidden}×{args.layers} (random), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores\n"
    )
    reference = best["plain generate loop"]
    print(
        "| contender | s | generated tokens | tokens/s | prompts/s | × plain loop "
        "| host work a batch (best) |"
    )
    print("|---|---|---|---|---|---|---|")
    batches = -(-len(prompts) // args.batch_size)
    for name, (seconds, generated) in best.items():
        rate = generated / seconds
        around = f"{host[name] / batches * 1000:.1f} ms" if name in host else ""
        print(
            f"| {name} | {seconds:.2f} | {generated} | {rate:,.0f} | {len(prompts) / seconds:.1f} "
            f"| {rate / (reference[1] / reference[0]):.2f} | {around} |"
        )


if __name__ == "__main__":
    main()
