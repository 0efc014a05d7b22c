from django.contrib import admin

from campaigns.models import Attempt, Batch, Campaign, ParameterVersion, Project, Unit


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    filter_horizontal = ["members"]


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "processor", "current_version", "created_at"]
    list_filter = ["processor"]
    raw_id_fields = ["current_version"]


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
