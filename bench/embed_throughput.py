"""Embedding throughput of our text-embedding processor beside sentence-transformers.

Same texts, same model, same truncation (256), same threads, in one run:
    .venv/bin/python bench/embed_throughput.py --limit 3000

Reports documents/s and real vs padded tokens for each contender, so a change
in padding never looks like an unexplained gain. Results go in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "corpus_stdlib_docstrings_5000.jsonl.gz"


def load_texts(path: Path, limit: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["text"] for _, line in zip(range(limit), fh, strict=False)]


def run_ours(processor, texts: list[str], batch_size: int) -> dict:
    real = padded = 0
    started = time.perf_counter()
    for start in range(0, len(texts), batch_size):
        result = processor.embed(texts[start : start + batch_size])
        real += result.real_tokens
        padded += result.padded_tokens
    seconds = time.perf_counter() - started
    return {
        "docs_per_s": len(texts) / seconds,
        "seconds": seconds,
        "padding": padded / real,
        "real_tokens": real,
        "padded_tokens": padded,
    }


def run_reference(model, texts: list[str], batch_size: int) -> dict:
    started = time.perf_counter()
    model.encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    seconds = time.perf_counter() - started
    return {"docs_per_s": len(texts) / seconds, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    import django

    django.setup()
    import torch
    from sentence_transformers import SentenceTransformer

    from campaigns.specs.builtin import TEXT_EMBEDDING
    from gpuworker.processors.text_embedding import TextEmbeddingProcessor, resolve_model_path

    texts = load_texts(args.corpus, args.limit)
    params = TEXT_EMBEDDING.clean({"batch_size": args.batch_size})
    ours = TextEmbeddingProcessor(params)
    reference = SentenceTransformer(
        str(resolve_model_path(params["model"])), device="cpu", local_files_only=True
    )
    reference.max_seq_length = params["max_tokens"]
    ours.embed(texts[:32])  # warm-up, both
    reference.encode(texts[:32])

    print(
        f"# {len(texts)} texts, batch {args.batch_size}, truncation {params['max_tokens']}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    rows = [
        ("briefgpu text-embedding, original order", run_ours(ours, texts, args.batch_size)),
        (
            "sentence-transformers encode (sorts by length)",
            run_reference(reference, texts, args.batch_size),
        ),
    ]
    print("| contender | docs/s | seconds | padding (padded/real tokens) |")
    print("|---|---:|---:|---:|")
    for name, r in rows:
        padding = f"×{r['padding']:.2f}" if "padding" in r else "n/a"
        print(f"| {name} | {r['docs_per_s']:.1f} | {r['seconds']:.1f} | {padding} |")


if __name__ == "__main__":
    main()
