"""Reading record rows as the worker does: `read_bytes` of a unit's locator.

    .venv/bin/python bench/record_reads.py [--rows 200000] [--sample 2000]
        [--code PATH ...] [--cases gz-order,gz-shuffled,arrow-zstd]

Writes (with gzip and pyarrow, not timed) --rows records (`id`, `text` of
200–1,000 characters) as `c.jsonl.gz`, and as a zstd-compressed Arrow IPC
file (batches of 1,000 rows). Each case runs in a child process of its own
(fresh caches; its peak RSS is its own, VmHWM), with the checkout `--code`
on its path (say a `git worktree add /tmp/base <commit>`, for a before/after
in one run; default this one):

- gz-order: every row of the .jsonl.gz read in file order (what a batch of
  the "original" order reads).
- gz-shuffled: --sample rows read in a random order (a length-grouped or
  token-budget batch's rows lie all over the file); the time per row is
  what a read costs once the process has read the file once before.
- arrow-zstd: --sample rows of the compressed Arrow file in a random order.

Each row's text is checked to be its row's (it starts with its id). Results go in
bench/RESULTS.md, "Record import at scale".
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def write(folder: Path, rows: int) -> None:
    import pyarrow as pa

    rng = random.Random(32)
    words = [f"w{n}" for n in range(5000)]
    texts = [f"r{i} " + " ".join(rng.choices(words, k=rng.randint(40, 200))) for i in range(rows)]
    lines, offset, where = [], 0, []
    for i, text in enumerate(texts):
        line = (json.dumps({"id": f"r{i}", "text": text}) + "\n").encode()
        where.append((i + 1, offset, len(line)))
        offset += len(line)
        lines.append(line)
    with gzip.open(folder / "c.jsonl.gz", "wb", compresslevel=6) as fh:
        fh.write(b"".join(lines))
    table = pa.table({"id": [f"r{i}" for i in range(rows)], "text": texts})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with (
        pa.OSFile(str(folder / "c.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, table.schema, options=options) as writer,
    ):
        writer.write_table(table, max_chunksize=1000)
    (folder / "where.json").write_text(json.dumps(where))


def child(folder: Path, case: str, sample: int) -> dict:
    # The checkout under test first: before this one's bench/ folder and the
    # editable install of the one the venv was made from.
    sys.path.insert(0, os.environ["BENCH_CODE"])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from campaigns.intake.inputs import read_bytes

    lines = json.loads((folder / "where.json").read_text())
    rows = list(range(len(lines)))
    if case != "gz-order":
        rows = random.Random(7).sample(rows, min(sample, len(rows)))
    if case.startswith("gz"):
        paths = [f"c.jsonl.gz#{lines[i][0]}@{lines[i][1]}+{lines[i][2]}:text" for i in rows]
    else:
        paths = [f"c.arrow#{i}@b{i // 1000}:{i % 1000}:text" for i in rows]
    del lines
    rss_before = _vm_hwm()
    started = time.perf_counter()
    for i, path in zip(rows, paths, strict=True):
        data = read_bytes(folder, path)
        assert data.startswith(f"r{i} ".encode()) and data.sha256, (i, path)
    wall = time.perf_counter() - started
    import campaigns

    return {
        "code": str(Path(campaigns.__file__).parent.parent),
        "case": case,
        "rows": len(rows),
        "wall_s": round(wall, 2),
        "ms_per_row": round(1000 * wall / len(rows), 3),
        "peak_rss_mib": _vm_hwm() // 1024,
        "rss_before_mib": rss_before // 1024,
    }


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sample", type=int, default=2000)
    parser.add_argument("--code", action="append", default=None)
    parser.add_argument("--cases", default="gz-order,gz-shuffled,arrow-zstd")
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "CASE"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), args.child[1], args.sample)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write(folder, args.rows)
        sizes = {p.name: p.stat().st_size >> 20 for p in folder.iterdir()}
        print(f"{args.rows:,} rows; files (MiB): {sizes}", flush=True)
        for code in args.code or [str(REPO)]:
            for case in args.cases.split(","):
                env = {**os.environ, "BENCH_CODE": str(Path(code).resolve())}
                command = [sys.executable, __file__, "--child", str(folder), case]
                command += ["--sample", str(args.sample)]
                done = subprocess.run(
                    command, env=env, capture_output=True, text=True, cwd=Path(code).resolve()
                )
                if done.returncode:
                    print(code, case, "failed:", done.stderr[-2000:], flush=True)
                    continue
                print(code, done.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
