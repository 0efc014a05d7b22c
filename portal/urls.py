from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from portal import legal_views
from portal.health import health

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="campaign_list"), name="home"),
    path("health/", health, name="health"),
    path("terms/", legal_views.terms, name="terms"),
    path("refunds/", legal_views.refunds, name="refunds"),
    path("contact/", legal_views.contact, name="contact"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("campaigns/", include("campaigns.web.urls")),
    path("order/", include("portal.order_urls")),
    path("review/", include("campaigns.web.review_urls")),
]
