"""The campaign setup form, its parameter fields generated from the processor's schema."""

from __future__ import annotations

import os
from pathlib import Path

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.text import slugify

from . import model_files
from .processor_specs import ProcessorSpec, all_specs, get_spec

PARAM_PREFIX = "param_"


def corpus_folders() -> list[Path]:
    """Folders under CORPUS_ROOTS, two levels deep: the only inputs the browser may pick."""
    found: list[Path] = []
    for root in settings.CORPUS_ROOTS:
        root = Path(root)
        if not root.is_dir():
            continue
        found.append(root)
        for dirpath, dirnames, _files in os.walk(root):
            depth = len(Path(dirpath).relative_to(root).parts)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if depth >= 2:
                dirnames[:] = []
            found.extend(Path(dirpath) / d for d in dirnames)
    return found


def param_fields(spec: ProcessorSpec, *, initial: dict | None = None) -> dict[str, forms.Field]:
    fields = {}
    for key, param in spec.params.items():
        value = (initial or {}).get(key, param.default)
        common = {
            "label": key.replace("_", " "),
            "help_text": param.help,
            "initial": value,
            "required": param.required,
        }
        if param.choices:
            fields[PARAM_PREFIX + key] = forms.ChoiceField(
                choices=[(c, c) for c in param.choices], **common
            )
        elif param.type is int:
            fields[PARAM_PREFIX + key] = forms.IntegerField(
                min_value=param.minimum, max_value=param.maximum, **common
            )
        elif param.type is float:
            fields[PARAM_PREFIX + key] = forms.FloatField(
                min_value=param.minimum, max_value=param.maximum, **common
            )
        else:
            fields[PARAM_PREFIX + key] = forms.CharField(max_length=1000, **common)
    return fields


class ParamsMixin:
    spec: ProcessorSpec | None = None

    def add_params(self, spec: ProcessorSpec, initial: dict | None = None) -> None:
        self.spec = spec
        self.fields.update(param_fields(spec, initial=initial))

    def params(self) -> dict:
        return {
            key[len(PARAM_PREFIX) :]: value
            for key, value in self.cleaned_data.items()
            # A field left empty (or absent, after a processor switch without
            # JavaScript) takes the schema's default.
            if key.startswith(PARAM_PREFIX) and value not in (None, "")
        }

    def check_params(self) -> None:
        if self.spec is None:
            return
        try:
            self.cleaned_data["params"] = self.spec.clean(self.params())
            # A model or labels file that is not there, said here, not by the first batch.
            model_files.digests(self.spec.model_params, self.cleaned_data["params"])
        except ValidationError as exc:
            self.add_error(None, exc)


class CampaignSetupForm(ParamsMixin, forms.Form):
    project = forms.CharField(
        max_length=200, help_text="an existing project of yours, or a new one"
    )
    name = forms.SlugField(max_length=100, help_text="lowercase letters, digits and dashes")
    processor = forms.ChoiceField()
    folder = forms.ChoiceField(help_text="inputs are read from here, never written")
    manifest = forms.FileField(
        required=False,
        help_text="optional CSV or JSONL (id, path, category…); paths relative to the folder",
    )

    def __init__(self, *args, processor: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        specs = all_specs()
        self.fields["processor"].choices = [(n, s.title) for n, s in sorted(specs.items())]
        self.fields["folder"].choices = [(str(p), str(p)) for p in corpus_folders()]
        chosen = processor if processor in specs else "text-embedding"
        self.fields["processor"].initial = chosen
        self.add_params(get_spec(chosen))

    def clean_name(self) -> str:
        from .models import Campaign

        name = self.cleaned_data["name"]
        if slugify(name) != name:
            raise ValidationError("lowercase letters, digits and dashes only")
        if Campaign.objects.filter(name=name).exists():
            raise ValidationError(f"a campaign named {name!r} exists already")
        return name

    def clean_manifest(self):
        manifest = self.cleaned_data.get("manifest")
        if manifest is None:
            return None
        if manifest.size > settings.MANIFEST_UPLOAD_MAX_BYTES:
            raise ValidationError(
                f"manifest is {manifest.size:,} bytes; the limit is "
                f"{settings.MANIFEST_UPLOAD_MAX_BYTES:,}"
            )
        suffix = Path(manifest.name).suffix.lower()
        if suffix not in (".csv", ".jsonl", ".ndjson"):
            raise ValidationError("a manifest is a .csv or .jsonl file")
        return manifest

    def clean(self):
        cleaned = super().clean()
        self.check_params()
        return cleaned


class ParametersForm(ParamsMixin, forms.Form):
    """New parameters for an existing campaign: saving makes a new version if they differ."""

    def __init__(self, *args, campaign, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_params(get_spec(campaign.processor), initial=campaign.current_version.params)

    def clean(self):
        cleaned = super().clean()
        self.check_params()
        return cleaned
