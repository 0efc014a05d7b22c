"""Staff manage the catalog, rates and the address pool here; orders move only through
the verification pages (portal/staff_views.py), so the admin shows them read-only."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from portal.models import (
    CryptoCurrency,
    Environment,
    ExchangeRate,
    GpuModel,
    Order,
    OrderEvent,
    PaymentAddress,
    PaymentNotice,
    RentalDuration,
    WebhookDelivery,
)


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ("name", "architecture", "memory_gb", "price_per_day", "stock", "active")
    list_editable = ("price_per_day", "stock", "active")


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ("name", "framework", "framework_version", "cuda_version", "image", "active")


@admin.register(RentalDuration)
class RentalDurationAdmin(admin.ModelAdmin):
    list_display = ("days", "purpose", "active")


@admin.register(CryptoCurrency)
class CryptoCurrencyAdmin(admin.ModelAdmin):
    list_display = ("code", "name", "decimals", "uri_scheme", "active")


@admin.register(ExchangeRate)
class ExchangeRateAdmin(admin.ModelAdmin):
    list_display = ("currency", "fiat_per_unit", "recorded_at", "recorded_by")
    list_filter = ("currency",)
    fields = ("currency", "fiat_per_unit")

    def save_model(self, request, obj, form, change):
        # A rate is stamped when staff enter it: its age decides whether it may quote.
        obj.recorded_at = timezone.now()
        obj.recorded_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(PaymentAddress)
class PaymentAddressAdmin(admin.ModelAdmin):
    """Staff load and fix free addresses; an assigned one is part of an order's
    record (its customer was told to pay there), so it is neither edited nor deleted."""

    list_display = ("address", "currency", "order", "assigned_at", "derivation_index")
    list_filter = ("currency", ("order", admin.EmptyFieldListFilter))
    # A derived address is written by the quote that derived it, never by hand.
    readonly_fields = ("order", "assigned_at", "chain", "derivation_index")

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.order_id is not None:
            return ("address", "currency", *self.readonly_fields)
        return self.readonly_fields

    def has_delete_permission(self, request, obj=None):
        # With obj, the delete page and the bulk action's per-object check
        # (admin.utils.get_deleted_objects) both ask here.
        if obj is not None and obj.order_id is not None:
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request, queryset):
        # The bulk action already refuses a selection with an assigned
        # address; this keeps any other caller from deleting one.
        super().delete_queryset(request, queryset.filter(order__isnull=True))


class EventInline(admin.TabularInline):
    model = OrderEvent
    extra = 0
    can_delete = False
    readonly_fields = ("created_at", "from_status", "to_status", "actor", "note")


class NoticeInline(admin.TabularInline):
    model = PaymentNotice
    extra = 0
    can_delete = False
    readonly_fields = ("created_at", "transaction_id", "claimed_amount", "after_expiry")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("__str__", "status", "exception", "gpu", "quantity", "fiat_total", "created_at")
    list_filter = ("status", "exception", "paid_late", "paid_late_claim")
    inlines = [NoticeInline, EventInline]

    def has_change_permission(self, request, obj=None):
        return False  # transitions go through services, never a raw edit

    def has_add_permission(self, request):
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("delivery_id", "event_type", "order", "outcome", "received_at")

    def has_change_permission(self, request, obj=None):
        return False
