"""The record path against SentenceTransformer.encode and the model alone: one table, goals beside.

    python bench/path_goals.py --limit 3000                # CUDA: profile budget = device memory
    python bench/path_goals.py --limit 200 --max-batch 32 --budget-mb 2000   # a CPU dry run

The corpus's texts become one record file (id, text): Parquet when pyarrow
imports, JSONL otherwise (the device machine may lack pyarrow, and the tree
carried there has no room for its wheel). A record campaign is the path
measured: a table of texts is the common case. First the batch-size profiler
runs on a record campaign over the file (`--chosen N` skips it), then, for
batch 16, 128 and the profile's chosen size B:

- `SentenceTransformer.encode(batch_size=B)`, in a process of its own;
- the worker path: a record campaign at the default batch policy with a token
  budget of B × max_tokens (the padded tokens of ST's fullest batch at B, so
  both hold the same worst-case activations), from `campaign run` (planning:
  weighing every text) to the last unit recorded, each batch through
  `run_batch` in this process as a worker runs it (the batch pipeline as
  settings.BATCH_PIPELINE says: on with CUDA);
- the model alone: the processor's `embed` on the same batches' texts,
  nothing else (no database, reads, writes or checks): what the path would
  reach with no host work at all.

Goals (issue 32): end to end ≥ 1.5 × ST's encode at the same batch and
≥ 0.8 × the model alone. `bash bench/device/goals.sh` runs this on a lent GPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.corpus import DEFAULT_CORPUS, read_texts  # noqa: E402

GOAL_ST, GOAL_MODEL = 1.5, 0.8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batches", default="16,128", help="batch sizes besides the profile's")
    parser.add_argument("--chosen", type=int, default=0, help="skip the profile: this batch size")
    parser.add_argument("--max-batch", type=int, default=4096, help="the profile's largest step")
    parser.add_argument("--budget-mb", type=int, default=None, help="the profile's memory budget")
    parser.add_argument("--format", choices=("auto", "parquet", "jsonl"), default="auto")
    args = parser.parse_args()

    from bench import django_env

    work = django_env.setup("bench-goals-")
    import logging

    logging.getLogger("gpuworker").setLevel(logging.WARNING)
    logging.getLogger("campaigns.runs.recording").setLevel(logging.WARNING)
    import torch

    from campaigns.intake.records import RecordColumns
    from campaigns.runs import setup
    from campaigns.specs.builtin import TEXT_EMBEDDING, resolve_model_path

    texts = read_texts(args.corpus, args.limit)
    records = write_records(work / "records", texts, args.format)
    project = setup.project_for_user(name="bench")

    def campaign(name: str, params: dict):
        c, report = setup.campaign_create(
            checkpoint_after=0,  # measuring speed: no stop for a spot check
            name=name,
            processor="text-embedding",
            project=project,
            records=records,
            columns=RecordColumns(text="text", id="id"),
            params={"max_tokens": args.max_tokens, **params},
        )
        return c

    device = "cuda" if torch.cuda.is_available() else "cpu"
    defaults = TEXT_EMBEDDING.clean({})
    print(
        f"# {len(texts)} texts as {records.suffix[1:]} records, max_tokens {args.max_tokens}, "
        f"{device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} cores; default policy {defaults['batch_policy']} "
        f"(token budget {defaults['token_budget']:,})",
        flush=True,
    )
    chosen, profile_line = args.chosen, "given with --chosen"
    if not chosen:
        started = time.perf_counter()
        chosen, profile_line = profile_choice(campaign("goals-profile", {}), args)
        print(f"# profile: {profile_line} ({time.perf_counter() - started:.0f} s)", flush=True)
    sizes = list(dict.fromkeys([*(int(b) for b in args.batches.split(",")), chosen]))

    # sentence-transformers first, in a process of its own (its own device memory).
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        st = pool.apply(
            sentence_transformers_rates,
            (str(resolve_model_path(defaults["model"])), texts, sizes, device, args.max_tokens),
        )

    print(
        f"| batch | token budget | ST encode docs/s | model alone docs/s | path docs/s "
        f"| path × ST (goal ≥ {GOAL_ST}) | path × model alone (goal ≥ {GOAL_MODEL}) "
        "| batches | plan s | goals |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    warm_up(campaign("goals-warm", {"batch_policy": "token_budget"}))
    for size in sizes:
        budget = size * args.max_tokens
        c = campaign(f"goals-b{size}", {"batch_policy": "token_budget", "token_budget": budget})
        path = run_path(c)
        model = model_alone(c, texts)
        by_st, by_model = path["rate"] / st[size], path["rate"] / model
        met = [
            f"× ST {'met' if by_st >= GOAL_ST else 'not met'}",
            f"× model {'met' if by_model >= GOAL_MODEL else 'not met'}",
        ]
        label = f"{size} (profile)" if size == chosen and not args.chosen else str(size)
        print(
            f"| {label} | {budget:,} | {rate(st[size])} | {rate(model)} | {rate(path['rate'])} | "
            f"{by_st:.2f} | {by_model:.2f} | {path['batches']} | {path['plan_s']:.1f} | "
            f"{', '.join(met)} |",
            flush=True,
        )
        if path["docs"] != len(texts):
            print(f"#   only {path['docs']} of {len(texts)} units succeeded", flush=True)


def rate(docs_per_s: float) -> str:
    """A rate as the table shows it: a decimal where a CPU's are small."""
    return f"{docs_per_s:,.0f}" if docs_per_s >= 100 else f"{docs_per_s:.1f}"


def write_records(folder: Path, texts: list[str], fmt: str) -> Path:
    """The texts as one record file, ids 0, 1, … in corpus order."""
    folder.mkdir()
    if fmt in ("auto", "parquet"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            if fmt == "parquet":
                raise
        else:
            path = folder / "texts.parquet"
            table = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts})
            pq.write_table(table, path, row_group_size=10_000)
            return path
    path = folder / "texts.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": str(i), "text": text}, ensure_ascii=False) + "\n")
    return path


def profile_choice(campaign, args) -> tuple[int, str]:
    """The profiler's chosen batch size on this device, and a line saying how."""
    from campaigns.profiles.services import profile_create
    from gpuworker.profiler import profile_run

    profile = profile_create(
        campaign=campaign,
        memory_budget=args.budget_mb * 2**20 if args.budget_mb else None,
        max_batch_size=args.max_batch,
    )
    profile_run(profile.pk)
    profile.refresh_from_db()
    if not profile.chosen_batch_size:
        raise SystemExit(f"the profile chose no batch size: {profile.error or profile.state}")
    line = (
        f"chosen batch {profile.chosen_batch_size} (max {args.max_batch}), "
        f"budget {profile.memory_budget / 2**20:,.0f} MiB, {profile.device}"
    )
    return profile.chosen_batch_size, line


def warm_up(campaign) -> None:
    """One batch run, so the model and its kernels are loaded before any timing."""
    from unittest import mock

    from campaigns.models import Batch
    from campaigns.runs import control, start
    from gpuworker.runner.batch import run_batch

    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
        run_batch(Batch.objects.filter(campaign=campaign).order_by("pk").first().pk)
        control.campaign_pause(campaign=campaign)


def run_path(campaign) -> dict:
    """`campaign run` to the last unit recorded, each batch as a worker runs it."""
    from unittest import mock

    from campaigns import selectors
    from campaigns.models import Batch
    from campaigns.runs import start
    from gpuworker.runner.batch import run_batch
    from gpuworker.runner.pipeline import finisher, pipeline_enabled

    hand_off = pipeline_enabled()
    with mock.patch.object(start.celery_app, "send_task"):  # no broker: run here
        started = time.perf_counter()
        start.campaign_run(campaign=campaign)
        plan_s = time.perf_counter() - started
        for pk in (
            Batch.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True)
        ):
            run_batch(pk, hand_off=hand_off)
        finisher.drain()
        seconds = time.perf_counter() - started
    done = selectors.campaign_counts(campaign=campaign).succeeded
    return {
        "rate": done / seconds,
        "docs": done,
        "plan_s": plan_s,
        "batches": Batch.objects.filter(campaign=campaign).count(),
    }


def model_alone(campaign, texts: list[str]) -> float:
    """docs/s of the processor's embed alone over the campaign's own batches."""
    import torch

    from campaigns.models import Unit
    from gpuworker.processors.text_embedding import TextEmbeddingProcessor

    params = campaign.current_version.params
    processor = TextEmbeddingProcessor(params)
    by_batch: dict[int, list[str]] = {}
    rows = Unit.objects.filter(campaign=campaign, batch__isnull=False).order_by("cost", "pk")
    for batch_id, uid in rows.values_list("batch_id", "uid"):
        by_batch.setdefault(batch_id, []).append(texts[int(uid)])
    batches = [by_batch[pk] for pk in sorted(by_batch)]
    prepared = [[processor.prepare(t.encode()) for t in batch] for batch in batches]
    processor.embed(prepared[0])  # this campaign's shapes: kernels chosen before timing
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    for batch in prepared:
        processor.embed(batch)  # its vectors come back to the host: synchronised
    return sum(map(len, prepared)) / (time.perf_counter() - started)


def sentence_transformers_rates(
    model_path: str, texts: list[str], sizes: list[int], device: str, max_tokens: int
) -> dict[int, float]:
    """docs/s of SentenceTransformer.encode on these texts at each batch size."""
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(model_path, device=device, local_files_only=True)
    reference.max_seq_length = max_tokens
    rates = {}
    for size in sizes:
        reference.encode(texts[: 2 * size], batch_size=size, show_progress_bar=False)  # warm
        started = time.perf_counter()
        reference.encode(texts, batch_size=size, normalize_embeddings=True, show_progress_bar=False)
        rates[size] = len(texts) / (time.perf_counter() - started)
    return rates


if __name__ == "__main__":
    main()
