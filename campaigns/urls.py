from django.urls import path

from . import views

urlpatterns = [
    path("", views.campaign_list, name="campaign_list"),
    path("<slug:name>/", views.campaign_detail, name="campaign_detail"),
    path("<slug:name>/run/", views.campaign_run, name="campaign_run"),
]
