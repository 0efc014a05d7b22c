"""What each processor accepts, known without importing torch.

The web process and the CLI validate parameters here before a version is
created; the class named by `implementation` (under gpuworker/, or a user's
own package) does the work in the worker. Processors are found in three
places: the built-ins below, the `briefgpu.processors` entry-point group, and
the BRIEFGPU_PROCESSORS setting (dotted paths to ProcessorSpec objects).
See docs/processors.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.module_loading import import_string

from campaigns.intake.inputs import ReadLimits
from campaigns.storage.paths import resolve_input

# The spec's hooks, named so that a plugin can annotate its functions with them
# (docs/processors.md). All run without torch: the web process, the CLI and
# verify call them.
#: verify's quick check of one output: (path, recorded size, params); raises InvalidOutput.
QuickCheck = Callable[[Path, int | None, dict], None]
#: verify --deep's check of one output's content: (path, params); raises InvalidOutput.
DeepCheck = Callable[[Path, dict], None]
#: verify --deep's check of a vector shard: (vectors (n, dim), params) -> each row's
#: InvalidOutput or None.
RowCheck = Callable[[Any, dict], list]
#: verify --deep's check of one line of a JSON row shard: (its fields, params);
#: raises InvalidOutput.
RecordCheck = Callable[[dict, dict], None]
#: One input's cost for grouping: (input path, params) -> tokens, pixels…
Cost = Callable[[Path, dict], int | None]
#: Many inputs' costs at once: (corpus root, source paths, params) -> a cost or None each.
Costs = Callable[[Path, list[str], dict], list[int | None]]
#: Raises campaigns.intake.inputs.InputError for input bytes the worker will refuse.
CheckInput = Callable[[bytes, dict], object]
#: The output suffix when the format is a parameter: params -> ".png".
SuffixFor = Callable[[dict], str]
#: Checks across cleaned parameters: params -> None, or raises ValidationError.
Validate = Callable[[dict], None]
#: How much of an input is read, for these parameters: params -> ReadLimits.
ReadLimitsFor = Callable[[dict], ReadLimits]


@dataclass(frozen=True)
class ParamSpec:
    """One parameter's schema: its default, and what `ProcessorSpec.clean` accepts."""

    default: Any
    choices: tuple | None = None
    type: type = str
    minimum: float | None = None
    maximum: float | None = None
    help: str = ""
    required: bool = False  # no usable default: the user must give it


@dataclass(frozen=True)
class ProcessorSpec:
    """What a processor is, for everything but its worker: its parameters'
    schema, its outputs' checks, its inputs' costs, and the dotted path of its
    implementation (a gpuworker.processors.base.Processor)."""

    name: str
    title: str
    output_suffix: str
    params: dict[str, ParamSpec] = field(default_factory=dict)
    # verify's checks of one output, given the version's parameters:
    # quick (size and header, no data read) and deep (the whole content).
    quick_check: QuickCheck | None = None
    deep_check: DeepCheck | None = None
    # For a processor whose batches write one vector shard (its worker-side
    # class sets shard_outputs; campaigns/storage/vector_shards.py): deep verify's
    # check of rows, (vectors (n, dim), params) -> each row's InvalidOutput or None.
    row_check: RowCheck | None = None
    # For a processor whose batches write one JSON row shard (its worker-side
    # class sets row_outputs; campaigns/storage/row_shards.py): deep verify's
    # check of a line's fields, (record, params) -> None or InvalidOutput.
    record_check: RecordCheck | None = None
    # "module:Class" of the worker-side implementation (imported by workers only).
    implementation: str = ""
    # Cost of one input for grouping (tokens, pixels), from its path and the
    # parameters; read without torch. None: every unit costs the same.
    cost: Cost | None = None
    # The same for many inputs at once, when one call is cheaper than one a
    # path (a tokenizer's batch call on every core): (corpus root, the units'
    # source paths, params) -> one cost each, or None for an input it could not
    # weigh. It reads through campaigns.intake.inputs.read_bytes, which refuses a path
    # out of the root. Optional; weigh() falls back on `cost`.
    costs: Costs | None = None
    # The parameters an input's cost depends on (a tokenizer, a token cap): a
    # version that changes one weighs the inputs again. None: every parameter.
    cost_params: tuple[str, ...] | None = None
    # How a batch's work grows with its units' costs: "longest" when the model
    # pads every item to the longest (texts), "sum" when each item weighs its
    # own cost. The profiler's estimate plans the corpus's batches with it.
    padding: str = "sum"
    # What a cost counts, for the pages' columns ("Real pixels", "Pixels/s").
    cost_unit: str = "tokens"
    # The parameters naming files or folders the outputs depend on (a model,
    # its labels): their sha256 goes into the version, and a worker checks
    # them before each batch (campaigns/specs/model_files.py).
    model_params: tuple[str, ...] = ()
    help: str = ""
    # Raises campaigns.intake.inputs.InputError for input bytes the processor will refuse;
    # lets the setup page show the failing inputs before anything runs.
    check_input: CheckInput | None = None
    # Each input is one UTF-8 text (the text embedding, a text plugin): a row
    # of a records file can be a unit, its text column the input
    # (campaigns/intake/records.py). The setup page offers records only to
    # such a processor, and `campaign create --records` refuses the others.
    takes_text: bool = False
    # Parameters a row of a records file may set for itself, from a column
    # (`campaign create --records … --param-column NAME=COLUMN`): such a
    # unit's input is its text and those values as one JSON object, which
    # campaigns.intake.records.carried(data) reads back; the processor applies
    # them (each through `clean_value`) and refuses a bad one as that unit's
    # input_invalid. Empty: the processor takes none.
    row_params: tuple[str, ...] = ()
    # When the output format is a parameter: params -> suffix (".png").
    suffix_for: SuffixFor | None = None
    # An adaptation processor: a run is one training that writes checkpoints,
    # not batches of outputs (campaigns/adaptation/services.py).
    training: bool = False
    # Checks across parameters, or of the files they name, once each value is
    # cleaned: params -> None, or ValidationError saying what to change. A
    # mistake found here costs the user a form error, not a campaign of
    # failed batches.
    validate: Validate | None = None
    # How much of an input planning, previews, the profiler and the worker
    # read (campaigns.intake.inputs.ReadLimits): a text only as far as its
    # model can use. None: whole, up to a `max_input_bytes` parameter if any.
    read_limits: ReadLimitsFor | None = None

    def input_limits(self, params: dict) -> ReadLimits:
        """What `read_bytes` reads of an input under these parameters."""
        if self.read_limits is not None:
            return self.read_limits(params)
        return ReadLimits(max_bytes=int(params.get("max_input_bytes") or 0) or None)

    def weigh(self, root: Path, source_paths: list[str], params: dict) -> list[int | None]:
        """The cost of each input under the corpus root, None where it could not
        be read or measured (the worker classifies that input)."""
        if self.costs is not None:
            return self.costs(root, source_paths, params)
        if self.cost is None:
            return [None] * len(source_paths)
        weights: list[int | None] = []
        for source_path in source_paths:
            try:
                weights.append(self.cost(resolve_input(root, source_path), params))
            except Exception:
                # Whatever a cost function raises on one input (an unreadable
                # file, a decompression bomb, a plugin's own bug) must not stop
                # the campaign's planning: the input weighs nothing, and the
                # worker fails its unit with a classified reason when it reads it.
                weights.append(None)
        return weights

    def cost_basis(self, params: dict) -> str:
        """What a set of costs was weighed under: equal for versions whose costs agree."""
        names = sorted(params) if self.cost_params is None else sorted(self.cost_params)
        basis = json.dumps([self.name, {k: params.get(k) for k in names}], sort_keys=True)
        return hashlib.sha256(basis.encode()).hexdigest()

    def suffix(self, params: dict) -> str:
        return self.suffix_for(params) if self.suffix_for else self.output_suffix

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
            if spec.required and given.get(key) in (None, ""):
                raise ValidationError(f"{key} is required for {self.name}: {spec.help}")
            cleaned[key] = self.clean_value(key, given.get(key, spec.default))
        if self.validate is not None:
            self.validate(cleaned)
        return cleaned

    def clean_value(self, key: str, value: Any) -> Any:
        """One parameter's value as its ParamSpec takes it (a number from its
        text, within its bounds, one of its choices), or ValidationError."""
        spec = self.params[key]
        if spec.type in (int, float):
            kind = "an integer" if spec.type is int else "a number"
            if isinstance(value, bool):
                raise ValidationError(f"{key} must be {kind}, got {value!r}")
            try:
                number = spec.type(value)
            except (TypeError, ValueError, OverflowError):
                raise ValidationError(f"{key} must be {kind}, got {value!r}") from None
            if spec.type is int and isinstance(value, float) and number != value:
                raise ValidationError(f"{key} must be {kind}, got {value!r}")
            if spec.type is float and number != number:  # NaN
                raise ValidationError(f"{key} must be a number, got {value!r}")
            if spec.minimum is not None and number < spec.minimum:
                raise ValidationError(f"{key} must be at least {spec.minimum}")
            if spec.maximum is not None and number > spec.maximum:
                raise ValidationError(f"{key} must be at most {spec.maximum}")
            value = number
        elif not isinstance(value, str):
            raise ValidationError(f"{key} must be text, got {value!r}")
        if spec.choices is not None and value not in spec.choices:
            raise ValidationError(
                f"{key} must be one of {', '.join(map(str, spec.choices))}, got {value!r}"
            )
        return value


def _load_plugins() -> dict[str, ProcessorSpec]:
    found: dict[str, ProcessorSpec] = {}
    for entry in entry_points(group="briefgpu.processors"):
        spec = entry.load()
        found[spec.name] = spec
    for dotted in getattr(settings, "BRIEFGPU_PROCESSORS", []):
        spec = import_string(dotted)
        found[spec.name] = spec
    return found


@functools.cache
def _registry() -> dict[str, ProcessorSpec]:
    from campaigns.specs.adaptation import ADAPTATION
    from campaigns.specs.audio import AUDIO_TRANSFORM
    from campaigns.specs.builtin import BUILTIN
    from campaigns.specs.generation import TEXT_GENERATION
    from campaigns.specs.speech import SPEECH_TO_TEXT

    builtin = (*BUILTIN, TEXT_GENERATION, AUDIO_TRANSFORM, SPEECH_TO_TEXT, *ADAPTATION)
    registry = {spec.name: spec for spec in builtin}
    for name, spec in _load_plugins().items():
        if not isinstance(spec, ProcessorSpec):
            raise TypeError(f"processor {name!r} is not a ProcessorSpec")
        registry[name] = spec
    return registry


def all_specs() -> dict[str, ProcessorSpec]:
    return dict(_registry())


def get_spec(name: str) -> ProcessorSpec:
    try:
        return _registry()[name]
    except KeyError:
        raise ValidationError(
            f"unknown processor {name!r}; available: {', '.join(sorted(_registry()))}"
        ) from None


def cost_unit(name: str) -> str:
    """What the processor's costs count ("tokens", "pixels"); a processor no
    longer installed still shows its campaign's figures, as tokens."""
    spec = _registry().get(name)
    return spec.cost_unit if spec else "tokens"
