from __future__ import annotations

from django.urls import path

from campaigns.web import effort_views, review_views

urlpatterns = [
    path("", review_views.review_queue, name="review_queue"),
    path("<int:pk>/decide/", review_views.review_decide, name="review_decide"),
    path("bulk-accept/", review_views.review_bulk_accept, name="review_bulk_accept"),
    path("flag/<int:unit_pk>/", review_views.unit_flag, name="review_unit_flag"),
    path("checkpoint/<int:pk>/", review_views.checkpoint_detail, name="checkpoint_detail"),
    path("checkpoint/<int:pk>/decide/", review_views.checkpoint_decide, name="checkpoint_decide"),
    path("holdout/<slug:name>/", review_views.holdout_panel, name="review_holdout"),
    path("effort/<slug:name>/", effort_views.review_effort, name="review_effort"),
    path("reasons/<slug:name>/", effort_views.reject_reasons_edit, name="reject_reasons_edit"),
]
