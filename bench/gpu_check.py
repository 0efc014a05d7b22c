"""What only a CUDA device can show: precision, memory accounting and a real OOM split.

    python bench/gpu_check.py --limit 3000 --out results/

Runs text-embedding campaigns through gpuworker.runner.batch.run_batch in this
process (database claim, file reads, model, atomic writes, output checks,
recording), on the CUDA device:

1. float32, float16 and bfloat16 over the same texts (token-budget batches):
   docs/s, model share, per-batch memory_allocated / memory_reserved / peak
   as recorded on the Batch rows, the leak warning's verdict, and how far the
   half-precision vectors are from the float32 ones (cosine).
2. Parity on the device: our float32 vectors against SentenceTransformer.encode
   on the same device and texts.
3. A real CUDA out-of-memory: the caching allocator is capped just above the
   model's weights (torch.cuda.set_per_process_memory_fraction), a batch of the
   longest texts must split in halves, and with an even tighter cap single units
   fail `out_of_memory` while the campaign goes on. The split is run twice: as
   shipped (retry after the except block) and with the retry inside the except
   block, where the failed forward pass's tensors stay alive during the retry.

Prints Markdown tables and writes them, with the raw figures as JSON, to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env  # noqa: E402
from bench.corpus import DEFAULT_CORPUS, corpus_folder, read_texts  # noqa: E402

MiB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--token-budget", type=int, default=65536)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--rehearse", action="store_true", help="without CUDA: float32 only, no memory caps"
    )
    args = parser.parse_args()

    work = django_env.setup("gpu-check-")
    import numpy as np
    import torch
    from django.conf import settings

    from campaigns import selectors
    from campaigns.models import Batch, Unit
    from campaigns.runs import batch_stats, setup, start
    from campaigns.storage.vector_shards import VectorReader
    from gpuworker.memory import runtime_facts
    from gpuworker.processors import get_processor
    from gpuworker.runner import run as runner_run
    from gpuworker.runner.batch import run_batch

    cuda = torch.cuda
    dtypes = ("float32", "float16", "bfloat16")
    if not torch.cuda.is_available():
        if not args.rehearse:
            sys.exit("gpu_check needs a CUDA device (--rehearse runs its code paths on the CPU)")
        cuda = _CpuStandIn()
        dtypes = ("float32",)
    from unittest import mock

    mock.patch.object(start.celery_app, "send_task").start()  # batches run here

    out_lines: list[str] = []
    raw: dict = {"facts": runtime_facts()}

    def say(line: str = "") -> None:
        print(line, flush=True)
        out_lines.append(line)

    def save() -> None:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_check.md").write_text("\n".join(out_lines) + "\n")
            (args.out / "gpu_check.json").write_text(json.dumps(raw, indent=1, default=str))

    say(f"# gpu_check: {json.dumps(raw['facts'])}")
    texts = read_texts(args.corpus, args.limit)
    corpus = corpus_folder(work / "corpus", texts)
    project = setup.project_for_user(name="gpu-check")

    def make(name: str, folder: Path, **params):
        campaign, _ = setup.campaign_create(
            checkpoint_after=0,  # measuring speed: no stop for a spot check
            name=name,
            processor="text-embedding",
            project=project,
            input_folder=folder,
            params=params,
        )
        return campaign

    def run_all(campaign) -> float:
        start.campaign_run(campaign=campaign)
        started = time.perf_counter()
        for pk in (
            Batch.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True)
        ):
            run_batch(pk)
        cuda.synchronize()
        return time.perf_counter() - started

    def vectors(campaign) -> dict[str, np.ndarray]:
        reader = VectorReader(settings.OUTPUT_ROOT)
        return {
            Path(u.source_path).stem: reader.vector(u.output_path)
            for u in Unit.objects.filter(campaign=campaign, state="succeeded")
        }

    # --- 1. precisions, memory per batch ---------------------------------
    say()
    say(
        f"## Precisions: {len(texts)} texts, token_budget {args.token_budget}, "
        "max_tokens 256, in-process run_batch"
    )
    say()
    say(
        "| dtype | docs/s | model share | batches | allocated after batch (MiB, first → last) "
        "| reserved max (MiB) | peak allocated max (MiB) | creep warning | min cosine vs float32 |"
    )
    say("|---|---:|---:|---:|---|---:|---:|---|---:|")
    reference = None
    raw["precisions"] = {}
    for dtype in dtypes:
        # Each precision's own kernels load and tune on first use (the first
        # run of 2026-11-30 timed float16 at half float32's speed): a
        # whole untimed pass first, on the same cached model.
        run_all(
            make(
                f"warm-{dtype}",
                corpus,
                dtype=dtype,
                batch_policy="token_budget",
                token_budget=args.token_budget,
            )
        )
        c = make(
            f"dtype-{dtype}",
            corpus,
            dtype=dtype,
            batch_policy="token_budget",
            token_budget=args.token_budget,
        )
        seconds = run_all(c)
        batches = list(Batch.objects.filter(campaign=c).order_by("pk"))
        # The columns the campaign page charts.
        allocated = [(b.mem_allocated or 0) / MiB for b in batches]
        reserved = max(b.mem_reserved or 0 for b in batches) / MiB
        peak = max(b.mem_peak_allocated or 0 for b in batches) / MiB
        done = selectors.campaign_counts(campaign=c).succeeded
        model_s = sum(b.compute_seconds or 0 for b in batches)
        creep = batch_stats.memory_creep(batch_stats.memory_chart(campaign=c))
        got = vectors(c)
        if dtype == "float32":
            reference = got
            cosine = 1.0
        else:
            cosine = min(float(np.dot(got[k], reference[k])) for k in got)
        raw["precisions"][dtype] = {
            "docs": done,
            "seconds": seconds,
            "model_s": model_s,
            "batch_model_s": [b.compute_seconds for b in batches],
            "allocated_mib": allocated,
            "reserved_max_mib": reserved,
            "peak_max_mib": peak,
            "min_cosine": cosine,
            "creep": creep,
        }
        say(
            f"| {dtype} | {done / seconds:.0f} | {100 * model_s / seconds:.0f}% | {len(batches)} "
            f"| {allocated[0]:.1f} → {allocated[-1]:.1f} | {reserved:.0f} | {peak:.0f} "
            f"| {creep or 'none'} | {cosine:.5f} |"
        )
        save()

    # --- 2. parity with sentence-transformers on the device --------------
    from sentence_transformers import SentenceTransformer

    from campaigns.specs.builtin import TEXT_EMBEDDING, resolve_model_path

    model_path = resolve_model_path(TEXT_EMBEDDING.clean({})["model"])
    st = SentenceTransformer(
        str(model_path),
        device="cuda" if torch.cuda.is_available() else "cpu",
        local_files_only=True,
    )
    st.max_seq_length = 256
    started = time.perf_counter()
    st_vectors = st.encode(texts, batch_size=16, normalize_embeddings=True, show_progress_bar=False)
    st_seconds = time.perf_counter() - started
    cosines = [
        float(np.dot(reference[f"doc-{i:05d}"], st_vectors[i]))
        for i in range(len(texts))
        if f"doc-{i:05d}" in reference
    ]
    diffs = [
        float(np.abs(reference[f"doc-{i:05d}"] - st_vectors[i]).max())
        for i in range(len(texts))
        if f"doc-{i:05d}" in reference
    ]
    raw["parity"] = {"min_cosine": min(cosines), "max_abs": max(diffs), "st_s": st_seconds}
    say()
    say(
        f"Parity on CUDA, float32, {len(cosines)} texts: min cosine with "
        f"SentenceTransformer.encode {min(cosines):.6f}, max |difference| {max(diffs):.2e} "
        f"(ST encode at batch 16: {len(texts) / st_seconds:.0f} docs/s)."
    )
    save()
    del st
    cuda.empty_cache()

    # --- 3. a real out-of-memory ------------------------------------------
    longest = sorted(range(len(texts)), key=lambda i: -len(texts[i]))[:256]
    heavy = work / "heavy"
    heavy.mkdir()
    for i in longest:
        (heavy / f"doc-{i:05d}.txt").write_text(texts[i], encoding="utf-8")
    total = cuda.get_device_properties(0).total_memory

    def inside_except(processor, ready, splits):
        """The retry as it was before: inside the except block."""
        try:
            return [(ready, processor.run([item for _, item in ready]))]
        except torch.OutOfMemoryError:
            cuda.empty_cache()
            if len(ready) == 1:
                ready[0][0].fail("out_of_memory", "does not fit alone")
                return []
            splits.append(len(ready))
            middle = len(ready) // 2
            return inside_except(processor, ready[:middle], splits) + inside_except(
                processor, ready[middle:], splits
            )

    say()
    say(
        "## Real CUDA out-of-memory: one batch of the 256 longest texts "
        "(max_tokens 512), allocator capped at weights + headroom"
    )
    say()
    say(
        "| retry | headroom MiB | splits | succeeded | out_of_memory | "
        "allocated after (MiB) | peak allocated (MiB) | batch state |"
    )
    say("|---|---:|---:|---:|---:|---:|---:|---|")
    raw["oom"] = []
    shipped = runner_run.run_splitting
    for n, (label, splitter, headroom) in enumerate(
        [
            ("after except (shipped)", shipped, 512),
            ("inside except (before)", inside_except, 512),
            ("after except (shipped)", shipped, 128),
            ("inside except (before)", inside_except, 128),
            ("after except (shipped)", shipped, 4),
        ]
    ):
        c = make(
            f"oom-{n}",
            heavy,
            batch_policy="original",
            batch_size=256,
            max_tokens=512,
        )
        # The processor (and its weights) is loaded by the first batch of this
        # version; load it now so the cap sits just above the weights.
        processor = get_processor(c.processor, c.current_version.params)
        processor.embed(["warm"])
        cuda.empty_cache()
        cuda.reset_peak_memory_stats()
        base = cuda.memory_allocated()
        cuda.set_per_process_memory_fraction((base + headroom * MiB) / total)
        try:
            with mock.patch.object(runner_run, "run_splitting", splitter):
                run_all(c)
        finally:
            cuda.set_per_process_memory_fraction(1.0)
        batch = Batch.objects.get(campaign=c)
        counts = selectors.campaign_counts(campaign=c)
        oom = Unit.objects.filter(campaign=c, error_class="out_of_memory").count()
        row = {
            "retry": label,
            "headroom_mib": headroom,
            "splits": batch.metrics.get("oom_splits", []),
            "succeeded": counts.succeeded,
            "oom": oom,
            "allocated_after_mib": cuda.memory_allocated() / MiB,
            "peak_mib": cuda.max_memory_allocated() / MiB,
            "base_mib": base / MiB,
            "state": batch.state,
        }
        raw["oom"].append(row)
        say(
            f"| {label} | {headroom} | {len(row['splits'])} | {row['succeeded']} | {oom} "
            f"| {row['allocated_after_mib']:.0f} | {row['peak_mib']:.0f} | {batch.state} |"
        )
        save()
        del processor
    say()
    say(f"Weights and runtime on the device before the capped runs: {base / MiB:.0f} MiB.")
    save()


class _CpuStandIn:
    """Lets --rehearse walk every code path on a machine without CUDA."""

    def synchronize(self):
        pass

    def empty_cache(self):
        pass

    def reset_peak_memory_stats(self):
        pass

    def set_per_process_memory_fraction(self, fraction):
        pass

    def memory_allocated(self):
        return 0

    def max_memory_allocated(self):
        return 0

    def get_device_properties(self, index):
        class Properties:
            total_memory = 1 << 40

        return Properties()


if __name__ == "__main__":
    main()
