"""URLs of the intents API, mounted under ``/api/v1/``."""

from __future__ import annotations

from django.urls import path

from operations import api

app_name = "api"

urlpatterns = [
    path("actions", api.ActionListView.as_view(), name="actions"),
    path("intents", api.IntentCollectionView.as_view(), name="intents"),
    path("intents/preview", api.IntentPreviewView.as_view(), name="intent-preview"),
    path("intents/<uuid:intent_id>", api.IntentDetailView.as_view(), name="intent-detail"),
    path("intents/<uuid:intent_id>/cancel", api.IntentCancelView.as_view(), name="intent-cancel"),
    path("callback", api.CallbackView.as_view(), name="callback"),
]
