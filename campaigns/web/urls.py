from django.urls import path

from campaigns.web import profile_views, training_views, version_views, views, watch_views

urlpatterns = [
    path("", views.campaign_list, name="campaign_list"),
    path("new/", views.campaign_new, name="campaign_new"),
    path("projects/<int:pk>/alerts/", watch_views.project_alerts, name="project_alerts"),
    path("<slug:name>/", views.campaign_detail, name="campaign_detail"),
    path("<slug:name>/run/", views.campaign_run, name="campaign_run"),
    path("<slug:name>/verify/", views.campaign_verify, name="campaign_verify"),
    path("<slug:name>/pause/", views.campaign_pause, name="campaign_pause"),
    path("<slug:name>/resume/", views.campaign_resume, name="campaign_resume"),
    path("<slug:name>/parameters/", views.campaign_params, name="campaign_params"),
    path("<slug:name>/export/<str:filename>", views.campaign_export, name="campaign_export"),
    path("<slug:name>/units/<int:pk>/", views.unit_detail, name="unit_detail"),
    path("<slug:name>/watch/", watch_views.campaign_watch, name="campaign_watch"),
    path("<slug:name>/versions/", version_views.campaign_versions, name="campaign_versions"),
    path(
        "<slug:name>/versions/<int:number>/<str:filename>",
        version_views.version_download,
        name="version_download",
    ),
    path("<slug:name>/profile/", profile_views.campaign_profile, name="campaign_profile"),
    path(
        "<slug:name>/profile/start/",
        profile_views.campaign_profile_start,
        name="campaign_profile_start",
    ),
    path(
        "<slug:name>/profile/<int:pk>/rerun/",
        profile_views.campaign_profile_rerun,
        name="campaign_profile_rerun",
    ),
    path("<slug:name>/training/", training_views.training_page, name="training_page"),
    path("<slug:name>/training/start/", training_views.training_start, name="training_start"),
    path("<slug:name>/training/stop/", training_views.training_stop, name="training_stop"),
    path(
        "<slug:name>/training/checkpoints/<int:pk>/use/",
        training_views.checkpoint_use,
        name="checkpoint_use",
    ),
]
