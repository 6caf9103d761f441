"""Root URLs: the API, its schema and docs, ``/metrics``, and the operator console."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console import views
from operations.api_support import api_not_found, api_server_error


def _healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("api/v1/", include("operations.urls")),
    path(
        "api/schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]),
        name="schema",
    ),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", authentication_classes=[], permission_classes=[]),
        name="api-docs",
    ),
    path("metrics", views.metrics, name="metrics"),
    path("healthz", _healthz, name="healthz"),
    path("login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", views.dashboard, name="dashboard"),
]


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Problem details under ``/api/``, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return api_not_found(request, exception)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Exception("not found"))


def handler500(request: HttpRequest) -> HttpResponse:
    """Problem details under ``/api/``, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return api_server_error(request)
    from django.views.defaults import server_error

    return server_error(request)
