"""The benchmark corpus (../shared/data): its texts, and a folder of them to import."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "corpus_stdlib_docstrings_5000.jsonl.gz"


def read_texts(corpus: Path, limit: int) -> list[str]:
    """The first `limit` texts of a .jsonl.gz corpus (one {"text": …} a line)."""
    with gzip.open(corpus, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["text"] for _, line in zip(range(limit), fh, strict=False)]


def corpus_folder(folder: Path, texts: list[str]) -> Path:
    """`folder` made, holding doc-00000.txt … one file a text, in order."""
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"doc-{i:05d}.txt").write_text(text, encoding="utf-8")
    return folder
