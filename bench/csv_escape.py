"""What keeping formulas out of CSV cells costs a large export: stream_csv over
N rows shaped like results.csv (paths, a shard member, a state, numbers, a
sha256), with the escape and with it switched off, alternately, best of 5.

    .venv/bin/python bench/csv_escape.py --rows 300000

No database: the rows are made here; only the CSV writing is measured.
Results go in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from campaigns.exports import csv_stream  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = [
        (
            f"folder/file-{i:07d}.txt",
            f"folder/file-{i:07d}.txt",
            f"v1-0123456789/shards/0001/b{i // 40}-abcdef.npz#{i % 40}",
            "succeeded",
            "",
            1536,
            "ab" * 32,
        )
        for i in range(args.rows)
    ]
    escape = csv_stream.safe_row
    best = {"escaped": float("inf"), "unescaped": float("inf")}
    for _ in range(args.rounds):
        for name, row_filter in (("escaped", escape), ("unescaped", lambda row: row)):
            csv_stream.safe_row = row_filter
            started = time.perf_counter()
            size = sum(len(chunk) for chunk in csv_stream.stream_csv(["c"] * 7, rows))
            best[name] = min(best[name], time.perf_counter() - started)
    csv_stream.safe_row = escape
    for name, seconds in best.items():
        print(f"{name:<10} {seconds:6.2f} s  {args.rows / seconds:>10,.0f} rows/s  {size:,} chars")


if __name__ == "__main__":
    main()
