"""The worker's host work alone: `run_batch` with the model replaced by an instant stand-in.

    DEBUG=0 .venv/bin/python bench/orchestration.py --limit 3000
    DEBUG=0 .venv/bin/python bench/orchestration.py --limit 3000 --profile 32768

On a GPU the model is a fraction of a batch's time (bench/RESULTS.md, the H200
figures): what a worker does around it — claim, read and check inputs, write
and check one file a unit, record — sets the speed. This measures that part on
any machine, ms a unit, for a small and a large token budget; `--profile` adds a
cProfile of the run at that budget. Not a model benchmark: the vectors are random.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.corpus import DEFAULT_CORPUS, corpus_folder, read_texts  # noqa: E402
from bench.django_env import setup  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--budgets", default="2048,32768", help="token budgets, comma-separated")
    parser.add_argument("--profile", type=int, default=0, help="cProfile the run at this budget")
    parser.add_argument("--profile-out", type=Path, help="and save those stats here (pstats)")
    args = parser.parse_args()

    work = setup("bench-orchestration-")
    import logging

    import numpy as np

    from campaigns import services
    from campaigns.models import Batch
    from gpuworker.batch_runner import run_batch
    from gpuworker.processors import text_embedding

    logging.getLogger("gpuworker").setLevel(logging.WARNING)
    texts = read_texts(args.corpus, args.limit)
    corpus = corpus_folder(work / "corpus", texts)
    project = services.project_for_user(name="bench")
    rng = np.random.default_rng(0)

    def instant_embed(self, items):
        vectors = rng.standard_normal((len(items), 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return text_embedding.EmbeddingBatch(
            vectors=vectors,
            norms=np.ones(len(items)),
            input_tokens=[50] * len(items),
            real_tokens=50 * len(items),
            padded_tokens=60 * len(items),
            seconds=0.0,
            memory=self.probe.snapshot(),
        )

    def campaign(name: str, budget: int):
        created, _ = services.campaign_create(
            checkpoint_after=0,
            name=name,
            processor="text-embedding",
            project=project,
            input_folder=corpus,
            params={"batch_size": 16, "batch_policy": "token_budget", "token_budget": budget},
        )
        services.campaign_run(campaign=created)
        return list(
            Batch.objects.filter(campaign=created).order_by("pk").values_list("pk", flat=True)
        )

    with (
        mock.patch.object(services.celery_app, "send_task"),
        mock.patch.object(text_embedding.TextEmbeddingProcessor, "embed", instant_embed),
    ):
        for pk in campaign("warm-up", 2048)[:3]:
            run_batch(pk)
        for budget in (int(b) for b in args.budgets.split(",")):
            batches = campaign(f"budget-{budget}", budget)
            profile = cProfile.Profile() if budget == args.profile else None
            started = time.perf_counter()
            if profile:
                profile.enable()
            for pk in batches:
                run_batch(pk)
            if profile:
                profile.disable()
            seconds = time.perf_counter() - started
            print(
                f"token budget {budget}: {len(batches)} batches, {len(texts)} units, "
                f"{seconds:.2f} s, {1000 * seconds / len(texts):.3f} ms a unit, "
                f"{1000 * seconds / len(batches):.1f} ms a batch"
            )
            if profile:
                pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
                if args.profile_out:
                    profile.dump_stats(args.profile_out)


if __name__ == "__main__":
    main()
