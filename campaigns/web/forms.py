"""The campaign setup form, its parameter fields generated from the processor's schema."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.text import slugify

from campaigns.intake import project_folders
from campaigns.intake.records import RecordColumns, param_columns
from campaigns.models import Notification, Project, ProjectAlerts
from campaigns.runs.setup import refuse_row_params
from campaigns.specs import model_files
from campaigns.specs.processors import ProcessorSpec, all_specs, get_spec
from campaigns.watch.notify import url_problem
from campaigns.web import setup_records

PARAM_PREFIX = "param_"
DEFAULT_HOLDOUT_PERCENT = 5
CHECKPOINT_ERROR = (
    "the checkpoint size is a whole number of units: 0 for no checkpoint, or more; "
    "leave it blank for the automatic size (1 % of the units, at least 200)"
)
HOLDOUT_ERROR = (
    f"the holdout share is a percentage from 0 to below 100 ({DEFAULT_HOLDOUT_PERCENT} "
    "holds out one unit in twenty; 0 holds out none)"
)
# The hidden field naming the processor whose parameter fields the form holds.
PARAMS_FOR = "params_for"


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
                min_value=None if param.minimum is None else int(param.minimum),
                max_value=None if param.maximum is None else int(param.maximum),
                **common,
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
    # True when the posted parameter fields were another processor's and were
    # replaced by this one's defaults (CampaignSetupForm).
    params_reset = False

    def add_params(self, spec: ProcessorSpec, initial: dict | None = None) -> None:
        self.spec = spec
        self.fields.update(param_fields(spec, initial=initial))

    def params(self) -> dict:
        return {
            key[len(PARAM_PREFIX) :]: value
            for key, value in self.cleaned_data.items()
            # A field left empty (or not posted) takes the schema's default.
            if key.startswith(PARAM_PREFIX) and value not in (None, "")
        }

    def unknown_params(self) -> dict:
        """Posted parameter fields the schema does not have: a typo or a tampered form."""
        if not self.is_bound:
            return {}
        return {
            key[len(PARAM_PREFIX) :]: self.data.get(key)
            for key in self.data
            if key.startswith(PARAM_PREFIX) and key not in self.fields
        }

    def check_params(self) -> None:
        if self.spec is None:
            return
        try:
            # Unknown keys go to the schema too, which refuses them with the
            # message the command line gives, rather than dropping them unseen.
            given = {**self.unknown_params(), **self.params()}
            self.cleaned_data["params"] = self.spec.clean(given)
            # A model or labels file that is not there, said here, not by the first batch.
            model_files.digests(self.spec.model_params, self.cleaned_data["params"])
        except ValidationError as exc:
            self.add_error(None, exc)


class CampaignSetupForm(ParamsMixin, forms.Form):
    # Projects, and the folders they may read, are the operator's to make
    # (docs/operations.md, "Giving a project its folders"): a user picks among theirs.
    project = forms.ChoiceField(
        help_text="a project of yours; its folders are the ones offered below",
        error_messages={
            "invalid_choice": "that project is not one of yours: choose one of those offered"
        },
    )
    name = forms.SlugField(max_length=100, help_text="lowercase letters, digits and dashes")
    processor = forms.ChoiceField()
    folder = forms.ChoiceField(
        help_text="a folder of the project, or one below it; inputs are read from here, "
        "never written",
        error_messages={
            "invalid_choice": "that folder is not one your projects may read: choose one "
            "of those offered"
        },
    )
    source = forms.ChoiceField(
        choices=[("folder", "a folder of files"), ("records", "a records file")],
        initial="folder",
        required=False,
        widget=forms.RadioSelect,
        label="Inputs",
        help_text="a file a unit, or a row a unit: a JSONL (.gz), CSV, Parquet file or "
        "an Arrow folder (datasets.save_to_disk) with an id and a text column",
    )
    records = forms.CharField(
        required=False,
        max_length=4096,
        label="Records file",
        help_text="its path, or its name within the inputs folder: .jsonl, .jsonl.gz, .csv, "
        ".parquet, or a folder of .arrow files; inside a folder of the project",
    )
    id_column = forms.CharField(
        required=False,
        max_length=200,
        label="Id column",
        help_text="blank: a row's id is file:N (its line, or its row number)",
    )
    text_column = forms.CharField(
        required=False, max_length=200, initial="text", label="Text column"
    )
    category_column = forms.CharField(
        required=False, max_length=200, label="Category column", help_text="optional"
    )
    row_params = forms.CharField(
        required=False,
        max_length=2000,
        label="Per-row parameter columns",
        help_text="optional, for a processor that takes them (text-generation: "
        "system_prompt, max_new_tokens, temperature, top_p, top_k, seed, stop): "
        "NAME=COLUMN, comma-separated, e.g. system_prompt=system, max_new_tokens",
    )
    manifest = forms.FileField(
        required=False,
        help_text="optional CSV or JSONL (id, path, category…); paths relative to the folder",
    )
    no_folder_categories = forms.BooleanField(
        required=False,
        label="Do not use top folders as categories",
        help_text="unticked, a unit without a category (from the manifest) takes the name of "
        "its top folder, so that the checkpoint's first group and spot check span the folders",
    )
    # Not min_value/max_value: their messages say nothing of what the number is;
    # the browser still gets min and max on the input.
    checkpoint_after = forms.IntegerField(
        required=False,
        label="Checkpoint size (units)",
        widget=forms.NumberInput(attrs={"min": 0, "step": 1, "placeholder": "automatic"}),
        error_messages={"invalid": CHECKPOINT_ERROR},
        help_text="units processed before the campaign stops for a spot check; "
        "blank: 1 % of the units, at least 200; 0: no checkpoint",
    )
    holdout_share = forms.FloatField(
        required=False,
        initial=DEFAULT_HOLDOUT_PERCENT,
        label="Holdout share (%)",
        widget=forms.NumberInput(attrs={"min": 0, "max": 99, "step": "any"}),
        error_messages={"invalid": HOLDOUT_ERROR},
        help_text="per cent of the units kept out of profiling and tuning and scored at "
        f"each checkpoint; blank: {DEFAULT_HOLDOUT_PERCENT}",
    )

    def __init__(
        self,
        data=None,
        *args,
        processor: str | None = None,
        refused_uploads: Collection[str] = (),
        user: Any,
        source: str | None = None,
        **kwargs,
    ):
        specs = all_specs()
        chosen = processor if processor in specs else "text-embedding"
        params_for = data.get(PARAMS_FOR) if data is not None else None
        if params_for in specs and params_for != chosen:
            # Another processor was picked without JavaScript, so the fields
            # posted are the previous one's: not a mistake to refuse, but not
            # parameters to use either. The form comes back with this one's.
            data = _with_defaults(data, specs[chosen])
            self.params_reset = True
        super().__init__(data, *args, **kwargs)
        # Files the view's upload handler stopped as they arrived (over the cap).
        self.refused_uploads = refused_uploads
        self.fields["processor"].choices = [(n, s.title) for n, s in sorted(specs.items())]
        self.user = user
        # What the user may read: the folders of their projects inside
        # CORPUS_ROOTS, grouped by project (project_folders.browsable_folders).
        self.browsable = project_folders.browsable_folders(user)
        projects, folders = self.fields["project"], self.fields["folder"]
        assert isinstance(projects, forms.ChoiceField) and isinstance(folders, forms.ChoiceField)
        projects.choices = [(p.name, p.name) for p in project_folders.projects_for_user(user)]
        folders.choices = [
            (b.project.name, [(str(f), str(f)) for f in b.folders]) for b in self.browsable
        ]
        self.fields["processor"].initial = chosen
        self.add_params(get_spec(chosen))
        # A records file only for a processor that takes text (ProcessorSpec.takes_text).
        self.records_refused = setup_records.refused_processor(self.spec)
        if source in ("folder", "records") and not self.records_refused:
            self.fields["source"].initial = source
        self.offered_records = setup_records.offered_records(
            [f for b in self.browsable for f in b.folders]
        )

    def uses_records(self) -> bool:
        return self.cleaned_data.get("source") == "records"

    def clean_name(self) -> str:
        from campaigns.models import Campaign

        name = self.cleaned_data["name"]
        if slugify(name) != name:
            raise ValidationError("lowercase letters, digits and dashes only")
        if Campaign.objects.filter(name=name).exists():
            raise ValidationError(f"a campaign named {name!r} exists already")
        return name

    def clean_manifest(self):
        manifest = self.cleaned_data.get("manifest")
        cap = settings.MANIFEST_UPLOAD_MAX_BYTES
        # The setup view stops a larger file as it arrives (refused_uploads);
        # the size covers a form given a file some other way.
        if "manifest" in self.refused_uploads or (manifest is not None and manifest.size > cap):
            raise ValidationError(f"manifest too large: the limit is {cap:,} bytes")
        if manifest is None:
            return None
        suffix = Path(manifest.name).suffix.lower()
        if suffix not in (".csv", ".jsonl", ".ndjson"):
            raise ValidationError("a manifest is a .csv or .jsonl file")
        return manifest

    def clean_checkpoint_after(self) -> int | None:
        value = self.cleaned_data.get("checkpoint_after")
        if value is not None and value < 0:
            raise ValidationError(CHECKPOINT_ERROR)
        return value

    def clean_holdout_share(self) -> float:
        """The share as a fraction, as the campaign keeps it; the form shows per cent."""
        value = self.cleaned_data.get("holdout_share")
        if value is None:
            value = DEFAULT_HOLDOUT_PERCENT
        if not 0 <= value < 100:
            raise ValidationError(HOLDOUT_ERROR)
        return value / 100

    def clean_source(self) -> str:
        return self.cleaned_data.get("source") or "folder"

    def clean(self):
        super().clean()
        cleaned = self.cleaned_data
        name, folder = cleaned.get("project"), cleaned.get("folder")
        if cleaned.get("source") == "records":
            if name:
                cleaned["project"] = project_folders.projects_for_user(self.user).get(name=name)
            self._clean_records(folder)
        elif name and folder:
            project = project_folders.projects_for_user(self.user).get(name=name)
            try:
                # Resolved and checked against the chosen project's folders: a
                # folder offered is one of some project of the user's, not
                # necessarily of this one, and a symlink may lead anywhere.
                cleaned["folder"] = project_folders.folder_for_user(
                    user=self.user, project=project, path=folder
                )
            except ValidationError as exc:
                self.add_error("folder", exc)
            cleaned["project"] = project
        self.check_params()
        return cleaned

    def _clean_records(self, folder: str | None) -> None:
        """The records and their columns (setup_records.check_records), the
        folder they lie in becoming the campaign's folder."""
        cleaned = self.cleaned_data
        if self.records_refused:
            self.add_error("source", self.records_refused)
            return
        if cleaned.get("manifest"):
            self.add_error(
                "manifest", "a records file lists its own units: leave the manifest empty"
            )
        given = (cleaned.get("records") or "").strip()
        text = (cleaned.get("text_column") or "").strip()
        if not given:
            self.add_error("records", "name the records file (or Arrow folder) to read")
        if not text:
            self.add_error("text_column", "name the column that holds each row's text")
        project = cleaned.get("project")
        if not given or not text or not isinstance(project, Project):
            return
        try:
            row_params = param_columns(cleaned.get("row_params") or "")
        except ValueError as exc:
            self.add_error("row_params", str(exc))
            return
        if row_params and self.spec is not None:
            try:
                refuse_row_params(self.spec, RecordColumns(text=text, params=row_params))
            except ValidationError as exc:
                self.add_error("row_params", exc)
                return
        columns = RecordColumns(
            text=text,
            id=(cleaned.get("id_column") or "").strip() or None,
            category=(cleaned.get("category_column") or "").strip() or None,
            params=row_params,
        )
        try:
            path = setup_records.records_path(folder=folder, given=given)
            root, files = setup_records.check_records(
                user=self.user, project=project, path=path, columns=columns
            )
        except ValidationError as exc:
            self.add_error(None, exc)
            return
        cleaned.update(records=path, columns=columns, folder=root, record_files=files)


def _with_defaults(data, spec: ProcessorSpec):
    """The posted data with its parameter fields replaced by the spec's defaults."""
    data = data.copy()
    for key in [key for key in data if key.startswith(PARAM_PREFIX)]:
        del data[key]
    for key, param in spec.params.items():
        if param.default is not None:
            data[PARAM_PREFIX + key] = str(param.default)
    return data


class ParametersForm(ParamsMixin, forms.Form):
    """New parameters for an existing campaign: saving makes a new version if they differ."""

    def __init__(self, *args, campaign, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_params(get_spec(campaign.processor), initial=campaign.current_version.params)

    def clean(self):
        cleaned = super().clean()
        self.check_params()
        return cleaned


class AlertsForm(forms.ModelForm):
    """A project's alerts: which events, by e-mail to its members, and a webhook."""

    events = forms.MultipleChoiceField(
        choices=Notification.Event.choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="each is sent once per event, and listed on the campaign page either way",
    )
    webhook_url = forms.URLField(
        required=False,
        max_length=500,
        assume_scheme="https",
        label="Webhook URL",
        help_text="a POST of a signed JSON body for each event; empty: no webhook",
    )
    failure_share = forms.FloatField(
        min_value=0.0,
        max_value=1.0,
        label="Failure share",
        help_text="the failures event is raised above this share of processed units (0.1 = 10%)",
    )

    class Meta:
        model = ProjectAlerts
        fields = ["events", "email", "webhook_url", "failure_share"]
        labels = {"email": "E-mail the project's members"}

    def clean_webhook_url(self) -> str:
        url = self.cleaned_data["webhook_url"].strip()
        if url and (problem := url_problem(url)):
            raise ValidationError(problem)
        return url
