from django import forms
from django.contrib import admin

from campaigns.intake import project_folders
from campaigns.models import (
    Attempt,
    Batch,
    Campaign,
    Notification,
    ParameterVersion,
    Project,
    ProjectAlerts,
    ProjectFolder,
    Unit,
    WorkerBeat,
)


class ProjectFolderForm(forms.ModelForm):
    """A folder as `campaign folders add` takes it: resolved, existing, inside CORPUS_ROOTS."""

    class Meta:
        model = ProjectFolder
        fields = ["project", "path"]
        help_texts = {
            "path": "a folder on the server inside CORPUS_ROOTS; symlinks are resolved and "
            "the real path is kept. The project's members may make campaigns over it "
            "and everything below it."
        }

    def clean_path(self):
        return project_folders.addable(self.cleaned_data["path"])


class ProjectFolderInline(admin.TabularInline):
    model = ProjectFolder
    form = ProjectFolderForm
    fields = ["path", "added_by", "created_at"]
    readonly_fields = ["added_by", "created_at"]
    extra = 1


def _added_by(request, folders) -> None:
    for folder in folders:
        if folder.pk is None and folder.added_by_id is None:
            folder.added_by = request.user


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    filter_horizontal = ["members"]
    inlines = [ProjectFolderInline]

    def save_formset(self, request, form, formset, change):
        folders = formset.save(commit=False)
        _added_by(request, [f for f in folders if isinstance(f, ProjectFolder)])
        for folder in folders:
            folder.save()
        for gone in formset.deleted_objects:
            gone.delete()
        formset.save_m2m()


@admin.register(ProjectFolder)
class ProjectFolderAdmin(admin.ModelAdmin):
    form = ProjectFolderForm
    list_display = ["path", "project", "added_by", "created_at"]
    list_filter = ["project"]
    search_fields = ["path", "project__name"]
    readonly_fields = ["added_by", "created_at"]

    def save_model(self, request, obj, form, change):
        _added_by(request, [obj])
        super().save_model(request, obj, form, change)


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "processor", "current_version", "created_at"]
    list_filter = ["processor"]
    raw_id_fields = ["current_version"]
    # The planner's own stamp (campaigns/runs/start.py): a form must not write it back.
    readonly_fields = ["planning_at", "exported_at"]


@admin.register(ParameterVersion)
class ParameterVersionAdmin(admin.ModelAdmin):
    list_display = ["campaign", "number", "fingerprint", "created_at"]

    def has_change_permission(self, request, obj=None):
        return False  # immutable once created


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ["pk", "campaign", "version", "state", "size", "worker", "finished_at"]
    list_filter = ["state"]
    raw_id_fields = ["campaign", "version"]


@admin.register(Unit)
class UnitAdmin(admin.ModelAdmin):
    list_display = ["uid", "campaign", "state", "error_class", "updated_at"]
    list_filter = ["state", "error_class"]
    search_fields = ["uid"]
    raw_id_fields = ["campaign", "batch"]
    # No COUNT(*) over millions of units for the changelist paginator.
    show_full_result_count = False


@admin.register(Attempt)
class AttemptAdmin(admin.ModelAdmin):
    list_display = ["unit", "outcome", "error_class", "worker", "finished_at", "duration_ms"]
    list_filter = ["outcome", "error_class"]
    raw_id_fields = ["unit", "batch", "version"]


@admin.register(ProjectAlerts)
class ProjectAlertsAdmin(admin.ModelAdmin):
    list_display = ["project", "email", "webhook_url"]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    """What the watch sweep raised and how it was delivered: a record, not a form."""

    list_display = ["created_at", "campaign", "event", "title", "email", "webhook", "tries"]
    list_filter = ["event", "email", "webhook"]
    raw_id_fields = ["campaign"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(WorkerBeat)
class WorkerBeatAdmin(admin.ModelAdmin):
    """Each worker process's own heartbeat row (gpuworker/beat.py); an old
    one may be deleted, a live worker writes its row again."""

    list_display = ["name", "device", "queues", "beat_at", "batches_done", "stopped_at"]

    def has_change_permission(self, request, obj=None):
        return False
