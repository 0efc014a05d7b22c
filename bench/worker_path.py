"""Our end-to-end worker path against SentenceTransformer.encode, same texts and model.

    .venv/bin/python bench/worker_path.py --limit 3000
    .venv/bin/python bench/worker_path.py --limit 3000 --broker-url redis://127.0.0.1:6379/15 \
        --database-url postgres://postgres@127.0.0.1:5432/bench_workers   # the production pair

For each batch policy (original, length_grouped, token_budget) a campaign is
created over the texts (one file each), its batches planned (token costs
measured) and run through gpuworker.runner.batch.run_batch — database claim,
file reads, model, atomic writes, output checks, bulk recording — in this
process, so the model time and the orchestration around it can be told apart.
Three more rows run campaigns through a real Celery worker process
(filesystem broker, or --broker-url), from `campaign run` (its planning
included) to the last unit recorded: length_grouped and token_budget with the
batch pipeline (settings.BATCH_PIPELINE: a batch's writes and recording
overlap the next batch's model), and token_budget without it. With
--processes 1,2 they run once per count: `celery worker -c N` with
WORKERS_PER_DEVICE=N, N processes feeding the one device (their host work on
N cores, not under one GIL); the orchestration column is then the processes'
time outside the model (N × wall − the model's time) over the model's time,
and a line under each Celery row says where it went: before each process's
first batch (planning: weighing every text), within batches, between them,
and after a process's last batch (time_outside_model). `plan s` is, for a
Celery row, the time from `campaign run` to the first batch's start.
sentence-transformers' encode runs on the same texts at the same batch size,
in a process of its own. Peak RSS: the largest resident size any batch
recorded (this process for the in-process rows, the worker's pool process for
the Celery rows), and sentence-transformers' process peak.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.corpus import DEFAULT_CORPUS, corpus_folder, read_texts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--token-budget", type=int, default=2048)
    parser.add_argument("--skip-celery", action="store_true")
    parser.add_argument(
        "--processes",
        default="1",
        help="worker processes for the Celery rows, comma-separated (e.g. 1,2): "
        "`celery worker -c N` with WORKERS_PER_DEVICE=N, each row once per N",
    )
    parser.add_argument(
        "--policies",
        default="original,length_grouped,token_budget",
        help="the in-process rows to run, comma-separated; token_budget:N runs the "
        "token_budget policy at budget N instead of --token-budget, so several budgets "
        "compare in one run (e.g. length_grouped,token_budget:4096,token_budget:16384); "
        "a policy may come more than once",
    )
    parser.add_argument(
        "--pipeline",
        action="store_true",
        help="each in-process row once more with the batch pipeline (BATCH_PIPELINE)",
    )
    parser.add_argument(
        "--weighed",
        action="store_true",
        help="weigh every text before the run is timed, as a profile of the campaign "
        "does (the method's order): the run then plans without tokenizing",
    )
    parser.add_argument(
        "--worker-log",
        type=Path,
        help="the Celery workers' log at INFO (each task's receipt and end, in ms) "
        "to this file, one after another, instead of nothing",
    )
    parser.add_argument(
        "--broker-url",
        default="",
        help="run the Celery row on this broker (e.g. redis://127.0.0.1:6379/15) "
        "instead of the embedded filesystem one. A Redis database is EMPTIED first "
        "(FLUSHDB): give one of its own. Each run has a fresh SQLite database whose "
        "batch ids start at 1 again, so a message left by an earlier run would make "
        "the worker run one of this run's batches",
    )
    parser.add_argument(
        "--database-url",
        default="",
        help="run every row on this database (e.g. postgres://postgres@127.0.0.1:5432/"
        "bench_workers) instead of a fresh SQLite file. It is EMPTIED first (flush): "
        "give one of its own",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    env = {
        "VAR_DIR": str(work / "var"),
        "OUTPUT_ROOT": str(work / "outputs"),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if args.broker_url:
        env["CELERY_BROKER_URL"] = args.broker_url
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    os.environ.update(env)
    # As a deployed worker runs (docs/deployment.md): DEBUG on logs every
    # query and quotes its parameters, ~5% of the worker's time outside the model.
    os.environ.setdefault("DEBUG", "0")
    if not args.database_url:
        os.environ.pop("DATABASE_URL", None)
    if not args.broker_url:
        os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()
    import logging

    # A line per batch otherwise (the worker's, and the recording's summary).
    logging.getLogger("gpuworker").setLevel(logging.WARNING)
    logging.getLogger("campaigns.runs.recording").setLevel(logging.WARNING)
    import torch
    from django.core.management import call_command
    from django.db.models import Max, Min

    from campaigns import selectors
    from campaigns.models import Batch
    from campaigns.runs import control, costs, leases, setup, start
    from campaigns.specs.builtin import TEXT_EMBEDDING, resolve_model_path
    from gpuworker.runner.batch import run_batch
    from gpuworker.runner.pipeline import finisher

    call_command("migrate", verbosity=0)
    if args.database_url:
        call_command("flush", interactive=False, verbosity=0)  # an earlier run's campaigns
    texts = read_texts(args.corpus, args.limit)
    corpus = corpus_folder(work / "corpus", texts)
    project = setup.project_for_user(name="bench")

    def campaign(policy: str, name: str):
        policy, budget = policy_budget(policy, args.token_budget)
        params = {
            "batch_size": args.batch_size,
            "batch_policy": policy,
            "token_budget": budget,
        }
        c, _ = setup.campaign_create(
            checkpoint_after=0,  # measuring speed: no stop for a spot check
            name=name,
            processor="text-embedding",
            project=project,
            input_folder=corpus,
            params=params,
        )
        if args.weighed:
            # As after a profile (docs/profiling.md), which weighs the whole
            # corpus under the version's parameters: the run finds every cost.
            costs.measure_costs(campaign=c, params=c.current_version.params, pending_only=False)
        return c

    # In-process rows run the batches here: no message goes to the broker.
    from unittest import mock

    quiet = mock.patch.object(start.celery_app, "send_task")
    quiet.start()
    # Warm the model once, like a worker that already ran a batch.
    warm = campaign("original", "warm-up")
    start.campaign_run(campaign=warm)
    run_batch(Batch.objects.filter(campaign=warm).first().pk)
    control.campaign_pause(campaign=warm)  # its other batches: cancelled, not left queued

    rows = []
    runs = [(p, False) for p in args.policies.split(",")]
    if args.pipeline:
        runs += [(p, True) for p in args.policies.split(",")]
    for i, (policy, pipelined) in enumerate(runs):
        # Numbered: a policy may come twice (a, b, a) to show the machine's drift.
        c = campaign(policy, f"path-{i}-{policy.replace('_', '-').replace(':', '-')}")
        started = time.perf_counter()
        start.campaign_run(campaign=c)
        plan_s = time.perf_counter() - started
        started = time.perf_counter()
        for pk in Batch.objects.filter(campaign=c).order_by("pk").values_list("pk", flat=True):
            # Pipelined as a worker with BATCH_PIPELINE: the finisher thread
            # writes and records a batch while the next one reads and computes.
            run_batch(pk, hand_off=pipelined)
        finisher.drain()
        run_s = time.perf_counter() - started
        batches = Batch.objects.filter(campaign=c)
        model_s = sum(b.compute_seconds or 0 for b in batches)
        real = sum(b.real_tokens or 0 for b in batches)
        padded = sum(b.padded_tokens or 0 for b in batches)
        done = selectors.campaign_counts(campaign=c).succeeded
        rows.append(
            {
                "name": f"worker path, {row_label(policy, args.token_budget)}"
                + (", batch pipeline" if pipelined else ""),
                "docs": done,
                "seconds": run_s,
                "plan_s": plan_s,
                "model_s": model_s,
                "real": real,
                "padded": padded,
                "batches": batches.count(),
                # This process's RSS after each batch (the model, the database, Django).
                "rss": max(b.rss or 0 for b in batches),
            }
        )

    quiet.stop()
    broker = "Redis" if args.broker_url else "filesystem broker"

    def celery_row(policy: str, pipeline: bool, processes: int) -> dict:
        """`campaign run` to the last unit recorded, through a real worker's
        `processes` pool processes sharing this machine's device."""
        # Only this run's batches in the queue.
        if args.broker_url.startswith("redis"):
            import redis

            # Unacknowledged messages of an earlier run come back on the next
            # consume; a queue purge does not reach them.
            redis.Redis.from_url(args.broker_url).flushdb()
        with leases.celery_app.connection_for_write() as conn:
            conn.default_channel.queue_purge("gpu")
        tag = f"{policy.replace('_', '-')}-{int(pipeline)}-{processes}"
        c = campaign(policy, f"celery-{tag}")
        log = args.worker_log.open("ab") if args.worker_log else subprocess.DEVNULL
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "-Q",
                "gpu",
                "-c",
                str(processes),
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO" if args.worker_log else "WARNING",
            ],
            cwd=REPO,
            env={
                **os.environ,
                **env,
                "BATCH_PIPELINE": "1" if pipeline else "0",
                "WORKERS_PER_DEVICE": str(processes),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            # Let the pool processes load torch and the model first: a batch a
            # text, more batches than processes.
            probe, _ = setup.campaign_create(
                checkpoint_after=0,  # measuring speed: no stop for a spot check
                name=f"celery-warm-{tag}",
                processor="text-embedding",
                project=project,
                input_folder=REPO / "campaigns" / "demo_corpus" / "news",
                params={"batch_size": 1},
            )
            start.campaign_run(campaign=probe)
            while selectors.campaign_counts(campaign=probe).active:
                time.sleep(0.2)
            # Planning (token counts) is part of the end-to-end time here.
            started = time.time()
            start.campaign_run(campaign=c)
            # The end is the last batch's recording time, so this process can
            # look seldom: polling every 0.1 s took CPU from the worker's model.
            while selectors.campaign_counts(campaign=c).active:
                time.sleep(1.0)
            span = Batch.objects.filter(campaign=c).aggregate(
                start=Min("started_at"), end=Max("finished_at")
            )
            run_s = span["end"].timestamp() - started
            # Planning and the first message's way to a worker: the time
            # before any model runs, part of run_s.
            head_s = span["start"].timestamp() - started
        finally:
            worker.terminate()
            worker.wait()
            if args.worker_log:
                log.close()
        batches = Batch.objects.filter(campaign=c)
        handing = "batch pipeline" if pipeline else "no pipeline"
        pool = "worker process" if processes == 1 else f"worker, {processes} processes"
        return {
            "name": f"Celery {pool} ({broker}, {handing}), {policy}",
            "processes": processes,
            "docs": selectors.campaign_counts(campaign=c).succeeded,
            "seconds": run_s,
            "plan_s": head_s,
            "model_s": sum(b.compute_seconds or 0 for b in batches),
            "real": sum(b.real_tokens or 0 for b in batches),
            "padded": sum(b.padded_tokens or 0 for b in batches),
            "batches": batches.count(),
            # The worker's pool process, after each batch.
            "rss": max(b.rss or 0 for b in batches),
            "where": time_outside_model(batches, started, started + run_s),
        }

    # sentence-transformers before the Celery rows, so the table can be
    # printed row by row: a run cut short by a time limit keeps what it measured.
    # In a fresh process of its own, so its peak RSS is its own.
    params = TEXT_EMBEDDING.clean({})
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where our worker ran
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        st_rate, st_rss = pool.apply(
            sentence_transformers_encode,
            (str(resolve_model_path(params["model"])), texts, args.batch_size, device),
        )

    def print_row(r: dict) -> None:
        rate = r["docs"] / r["seconds"]
        # Several processes: the model times add up over processes, so the
        # time outside the model is the processes' wall time less the model's.
        worker_s = r.get("processes", 1) * r["seconds"]
        model_wall = r["model_s"] / r.get("processes", 1)
        print(
            f"| {r['name']} | {rate:.1f} | {rate / st_rate:.2f} | "
            f"{r['real'] / r['seconds']:.0f} | ×{r['padded'] / max(1, r['real']):.2f} | "
            f"{r['batches']} | {100 * r['model_s'] / worker_s:.0f}% | "
            # The measure: time outside the model over the model's time.
            f"{100 * (worker_s - r['model_s']) / r['model_s']:.0f}% | "
            # The ceiling: this row with no orchestration at all.
            f"{r['docs'] / model_wall / st_rate:.2f} | "
            f"{r['plan_s']:.1f} | {r['rss'] / 2**20:.0f} |",
            flush=True,
        )

    from django.db import connection

    print(
        f"# database {connection.vendor}, broker {broker}; "
        f"{len(texts)} texts, batch {args.batch_size}, token budget {args.token_budget}, "
        f"truncation 256, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{'texts weighed before the runs, ' if args.weighed else ''}"
        f"{os.cpu_count()} cores, {device}"
    )
    print(
        "| path | docs/s | × ST | tokens/s | padding | batches | model share "
        "| orchestration ÷ model | model alone × ST | plan s | peak RSS MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| sentence-transformers encode (sorts by length) | {st_rate:.1f} | 1.00 | — | — | "
        f"{-(-len(texts) // args.batch_size)} | — | — | — | — | {st_rss / 2**20:.0f} |"
    )
    for r in rows:
        print_row(r)
    if not args.skip_celery:
        for processes in [int(n) for n in args.processes.split(",")]:
            # Most telling first.
            for policy, pipeline in (
                ("token_budget", True),
                ("token_budget", False),
                ("length_grouped", True),
            ):
                row = celery_row(policy, pipeline, processes)
                print_row(row)
                where = ", ".join(f"{k} {v:.2f} s" for k, v in row["where"].items())
                print(f"#   its processes' time outside the model: {where}", flush=True)
    print(
        "# peak RSS of this process "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )


def policy_budget(policy: str, token_budget: int) -> tuple[str, int]:
    """("token_budget", 8192) from "token_budget:8192"; a bare policy keeps
    --token-budget."""
    name, _, budget = policy.partition(":")
    return name, int(budget) if budget else token_budget


def row_label(policy: str, token_budget: int) -> str:
    """A row's policy as the table shows it: a token budget with its size."""
    name, budget = policy_budget(policy, token_budget)
    return f"{name} {budget:,}" if name == "token_budget" else name


def time_outside_model(batches, start: float, end: float) -> dict[str, float]:
    """Where the Celery processes' time outside the model went, summed over
    processes (it adds up to N × wall − the model's time): before each one's
    first batch (planning, the first message), within batches (claim, reads,
    writes), between one batch's end and the next one's claim (its
    `finished_at` is taken as its recording starts: the recording's
    statements, the checkpoint's read, the task's return, the acknowledgement,
    the next message), and after each one's last batch while another still
    ran. With the pipeline a process's batches overlap (the next one's model
    runs while the last one records), so "between" goes below zero."""
    head = within = between = tail = 0.0
    by_process: dict[str, list] = {}
    for b in sorted(batches, key=lambda b: b.started_at):
        by_process.setdefault(b.worker, []).append(b)
    for own in by_process.values():
        head += own[0].started_at.timestamp() - start
        tail += end - max(b.finished_at.timestamp() for b in own)
        for b in own:
            within += (b.finished_at - b.started_at).total_seconds() - (b.compute_seconds or 0)
        for before, after in itertools.pairwise(own):
            between += (after.started_at - before.finished_at).total_seconds()
    return {"before": head, "within": within, "between": between, "after": tail}


def sentence_transformers_encode(
    model_path: str, texts: list[str], batch_size: int, device: str
) -> tuple[float, int]:
    """(docs/s, peak RSS in bytes) of SentenceTransformer.encode on these texts."""
    import resource

    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(model_path, device=device, local_files_only=True)
    reference.max_seq_length = 256  # our max_tokens
    reference.encode(texts[:32])
    started = time.perf_counter()
    reference.encode(
        texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False
    )
    rate = len(texts) / (time.perf_counter() - started)
    return rate, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    main()
