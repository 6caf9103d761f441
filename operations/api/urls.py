"""URLs of the intents API, mounted under ``/api/v1/``."""

from __future__ import annotations

from django.db import transaction
from django.urls import path

from operations.api import views

app_name = "api"

urlpatterns = [
    path("actions", views.ActionListView.as_view(), name="actions"),
    path("intents", views.IntentCollectionView.as_view(), name="intents"),
    path("intents/preview", views.IntentPreviewView.as_view(), name="intent-preview"),
    # Never inside a request-wide transaction (ATOMIC_REQUESTS): ?wait= must hold none while it
    # waits, and must see the changes other transactions commit (operations.api.waiting).
    path(
        "intents/<uuid:intent_id>",
        transaction.non_atomic_requests(views.IntentDetailView.as_view()),
        name="intent-detail",
    ),
    path("intents/<uuid:intent_id>/cancel", views.IntentCancelView.as_view(), name="intent-cancel"),
    path("callback", views.CallbackView.as_view(), name="callback"),
]
