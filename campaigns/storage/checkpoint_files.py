"""Training checkpoints on disk: written whole or not at all, and checked before use.

A checkpoint is a folder `step-00000040/` under the campaign's checkpoint root:
the weights as safetensors (a Hugging Face model folder for an encoder, one
`model.safetensors` state dict for a classifier), the optimizer's state, and
`checkpoint.json` — the linkage (base model and its weights checksum, parameter
version, data manifest checksum, step, metrics) plus the sha256 of every file.
It is built in `step-00000040.partial/` and renamed into place after every file
and the folder are synced, so a killed worker leaves a `.partial` folder that
nothing ever loads, never a checkpoint with half its weights.

A whole checkpoint is resumed from only when no record contradicts it: the
database row of its step (campaigns.models.ModelCheckpoint) records the sha256
of its sidecar and of its weights (`against_record`), and one with no row (its
worker died before recording it) must name the very training that resumes
(campaigns/adaptation/services.py, `checkpoint_contradictions`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

SIDECAR = "checkpoint.json"
PARTIAL = ".partial"
_NAME = re.compile(r"^step-(\d{8})$")


class CheckpointError(Exception):
    """A checkpoint that must not be loaded, and why."""


def folder_name(step: int) -> str:
    return f"step-{step:08d}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def weights_checksum(folder: Path) -> str:
    """One sha256 over the folder's safetensors files (a model's identity)."""
    digest = hashlib.sha256()
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no .safetensors weights")
    for path in files:
        digest.update(path.name.encode())
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(root: Path, step: int, save: Callable[[Path], None], linkage: dict) -> Path:
    """Build the checkpoint of `step` with `save(folder)`, then put it in place."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / folder_name(step)
    partial = root / (final.name + PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    save(partial)
    files = {p.name: sha256_file(p) for p in sorted(partial.iterdir()) if p.is_file()}
    sidecar = {**linkage, "step": step, "weights_sha256": weights_checksum(partial)}
    sidecar["files"] = files
    (partial / SIDECAR).write_text(json.dumps(sidecar, indent=1, sort_keys=True))
    for path in partial.iterdir():
        _fsync(path)
    _fsync(partial)
    if final.exists():  # the same step again (a resumed run redoing it): replace
        shutil.rmtree(final)
    os.rename(partial, final)
    _fsync(root)
    return final


def read_sidecar(folder: Path) -> dict:
    """The sidecar's JSON object; CheckpointError when there is none to read."""
    try:
        sidecar = json.loads((folder / SIDECAR).read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{folder.name}: no {SIDECAR} (an unfinished checkpoint)") from exc
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{folder.name}: {SIDECAR} unreadable: {exc}") from exc
    if not isinstance(sidecar, dict):
        raise CheckpointError(f"{folder.name}: {SIDECAR} is not a JSON object")
    return sidecar


def problems(folder: Path) -> list[str]:
    """Why this checkpoint must not be loaded; empty when every file is as written."""
    if folder.name.endswith(PARTIAL):
        return [f"{folder.name}: a partial checkpoint (the writer stopped before the end)"]
    try:
        sidecar = read_sidecar(folder)
    except CheckpointError as exc:
        return [str(exc)]
    found = []
    named = _NAME.match(folder.name)
    if named and sidecar.get("step") != int(named.group(1)):
        found.append(f"{folder.name}: {SIDECAR} names step {sidecar.get('step')!r:.40}")
    files = sidecar.get("files")
    if not isinstance(files, dict) or not files:
        return [*found, f"{folder.name}: {SIDECAR} lists no files"]
    for name, expected in sorted(files.items()):
        if not _plain_name(name):
            # Only files of this folder are checked: a name that leads out of
            # it (or to /dev/zero) is never opened.
            found.append(f"{folder.name}: {SIDECAR} lists {name!r:.80}, not a file name")
            continue
        path = folder / name
        if not path.is_file():
            found.append(f"{folder.name}/{name}: missing")
        elif sha256_file(path) != expected:
            found.append(f"{folder.name}/{name}: sha256 differs from the one recorded")
    return found


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\x00" not in name


def against_record(folder: Path, *, weights_sha256: str, sidecar_sha256: str = "") -> list[str]:
    """Why this checkpoint is not the one its row records: its sidecar's bytes
    (a digit of a step or a checksum changed, which its own file list cannot
    see) or its weights' checksum differ; empty when they agree."""
    found = []
    if sidecar_sha256:
        try:
            if sha256_file(folder / SIDECAR) != sidecar_sha256:
                found.append(f"{folder.name}/{SIDECAR}: sha256 differs from the one recorded")
        except OSError as exc:
            found.append(f"{folder.name}/{SIDECAR}: unreadable: {exc}")
    if weights_sha256:
        try:
            recorded = read_sidecar(folder).get("weights_sha256")
        except CheckpointError as exc:
            return [*found, str(exc)]
        if recorded != weights_sha256:
            found.append(f"{folder.name}: weights sha256 differs from the one recorded")
    return found


def verified(folder: Path) -> dict:
    """The sidecar of a checkpoint that is whole; CheckpointError otherwise."""
    found = problems(folder)
    if found:
        raise CheckpointError("; ".join(found))
    return read_sidecar(folder)


def listing(root: Path) -> list[Path]:
    """Complete-looking checkpoint folders by step (partial ones excluded)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_whole(
    root: Path, accept: Callable[[Path, dict], list[str]] | None = None
) -> tuple[Path, dict] | None:
    """The last checkpoint that verifies and that `accept` (folder, sidecar ->
    what contradicts it) finds nothing against; a damaged or contradicted later
    one is skipped, not loaded."""
    for folder in reversed(listing(root)):
        try:
            sidecar = verified(folder)
        except CheckpointError:
            continue
        if accept is None or not accept(folder, sidecar):
            return folder, sidecar
    return None


def prune(root: Path, *, keep_last: int, keep: set[int]) -> list[int]:
    """Delete checkpoints outside the policy (the last N, and the steps in `keep`)."""
    folders = listing(root)
    last = {int(_NAME.match(p.name).group(1)) for p in folders[-keep_last:]} if keep_last else set()
    removed = []
    for folder in folders:
        step = int(_NAME.match(folder.name).group(1))
        if step not in last and step not in keep:
            shutil.rmtree(folder)
            removed.append(step)
    for partial in root.glob(f"*{PARTIAL}"):
        shutil.rmtree(partial, ignore_errors=True)
    return removed
