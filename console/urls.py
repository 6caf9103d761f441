"""Root URLs: the API, its schema and docs, ``/metrics``, and the operator console."""

from __future__ import annotations

import sys

from csp.decorators import csp_update
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.defaults import page_not_found, server_error
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from console import views
from console.middleware import database_unavailable_response
from operations.api.support import api_not_found, api_server_error
from operations.workers.delivery import database_unavailable


def _healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("api/v1/", include("operations.api.urls")),
    path(
        "api/schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]),
        name="schema",
    ),
    # Swagger UI: its init script is a file of its own (the split view) and drf-spectacular's
    # inline style a static file (the template). Its CSS draws icons as data: images: the one
    # addition to the console's Content-Security-Policy (console/settings.py), on this page only.
    path(
        "api/docs/",
        csp_update({"img-src": ["data:"]})(
            SpectacularSwaggerSplitView.as_view(
                url_name="schema",
                template_name="console/swagger_ui.html",
                authentication_classes=[],
                permission_classes=[],
            )
        ),
        name="api-docs",
    ),
    path("metrics", views.metrics, name="metrics"),
    path("healthz", _healthz, name="healthz"),
    path("login/", views.login_view, name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="login"), name="logout"),
    path("admin/", admin.site.urls),
    path("", views.dashboard, name="dashboard"),
    # The console's health page (people); /healthz above is the load balancer's probe.
    path("health/", views.health, name="health"),
    path("approvals/", views.approvals_inbox, name="approvals"),
    path("approvals/<uuid:intent_id>/", views.approval_detail, name="approval-detail"),
    path("approvals/<uuid:intent_id>/approve", views.approval_approve, name="approval-approve"),
    path("approvals/<uuid:intent_id>/reject", views.approval_reject, name="approval-reject"),
    path("unknown/", views.unknown_queue, name="unknown"),
    path("unknown/<uuid:intent_id>/", views.unknown_detail, name="unknown-detail"),
    path(
        "unknown/<uuid:intent_id>/resolve/<str:verb>",
        views.unknown_resolve,
        name="unknown-resolve",
    ),
    path("unknown/<uuid:intent_id>/lookup", views.unknown_lookup, name="unknown-lookup"),
    path("unknown/<uuid:intent_id>/assign", views.intent_assign_view, name="intent-assign"),
    path("held/<uuid:intent_id>/", views.held_detail, name="held-detail"),
    path("held/<uuid:intent_id>/resolve/<str:verb>", views.held_resolve, name="held-resolve"),
    path("duplicates/<int:finding_id>/", views.duplicate_detail, name="duplicate-detail"),
    path("findings/", views.provider_findings_list, name="provider-findings"),
    path("findings/<int:finding_id>/", views.provider_finding_detail, name="provider-finding-detail"),
    path(
        "findings/<int:finding_id>/resolve/<str:verb>",
        views.provider_finding_resolve,
        name="provider-finding-resolve",
    ),
    path("statements/", views.statements_page, name="statements"),
    path("statements/upload", views.statement_upload, name="statement-upload"),
    path("statements/mapping", views.statement_mapping, name="statement-mapping"),
    path(
        "duplicates/<int:finding_id>/resolve/<str:verb>",
        views.duplicate_resolve,
        name="duplicate-resolve",
    ),
    path("intents/", views.intent_list, name="intents"),
    path("intents/<uuid:intent_id>/", views.intent_detail, name="intent-detail"),
    # An archived intent (issue 36), read-only from its archive file.
    path("archive/intents/<uuid:intent_id>/", views.archived_intent_detail, name="archived-intent"),
    path("audit/", views.audit_log, name="audit"),
    path("audit/export.csv", views.audit_export, name="audit-export"),
    path("audit/export.jsonl", views.audit_export_jsonl, name="audit-export-jsonl"),
    path("audit/verify/", views.audit_verify_view, name="audit-verify"),
    path("webhooks/", views.webhook_list, name="webhooks"),
    # Providers' signed events (issue 19): no session, the signature is the authentication.
    path("providers/<slug:source>/events", views.provider_event_inbox, name="provider-event-inbox"),
    path("provider-events/", views.provider_event_list, name="provider-events"),
    path("webhooks/<int:delivery_id>/resend", views.webhook_resend_view, name="webhook-resend"),
    # The lab's pages (drills), mounted by dotted name like an installed app: no product module
    # imports the lab (lint-imports), and the URLconf only names it.
    path("", include("console.lab.urls")),
]


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Problem details under ``/api/``, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return api_not_found(request, exception)
    return page_not_found(request, exception or Exception("not found"))


def handler500(request: HttpRequest) -> HttpResponse:
    """Problem details under ``/api/``, Django's page elsewhere; a 503 with ``Retry-After``
    when the error is an unreachable database.

    Django calls this while handling the exception (``django.core.handlers.exception``), so
    ``sys.exc_info()`` names it; this covers errors raised in middleware, which
    ``DatabaseUnavailableMiddleware.process_exception`` never sees.
    """
    error = sys.exc_info()[1]
    if error is not None and database_unavailable(error):
        return database_unavailable_response(request)
    if request.path.startswith("/api/"):
        return api_server_error(request)
    return server_error(request)
