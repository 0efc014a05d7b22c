from django.urls import path

from portal import order_views, recovery_views, staff_views, webhook_views

urlpatterns = [
    path("", order_views.order_new, name="order_new"),
    path("price/", order_views.order_price, name="order_price"),
    path("recover/", recovery_views.order_recover, name="order_recover"),
    path("t/<str:token>/", order_views.order_track, name="order_track"),
    path("t/<str:token>/paid/", order_views.order_paid, name="order_paid"),
    path("t/<str:token>/dossier.zip", order_views.order_dossier, name="order_dossier"),
    # BTCPay Server posts here (docs/btcpay.md).
    path("btcpay/webhook/", webhook_views.btcpay_webhook, name="btcpay_webhook"),
    path("staff/", staff_views.staff_queue, name="staff_queue"),
    path("staff/<int:pk>/", staff_views.staff_order, name="staff_order"),
    path("staff/<int:pk>/action/", staff_views.staff_order_action, name="staff_order_action"),
    path("staff/<int:pk>/access/", staff_views.staff_order_access, name="staff_order_access"),
]
