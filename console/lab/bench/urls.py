"""URLconf of the benchmark's gunicorn: every real route plus ``/bench/trivial``."""

from __future__ import annotations

from django.urls import path

from console.lab.bench.views import TrivialView
from console.urls import handler404, handler500
from console.urls import urlpatterns as console_urlpatterns

__all__ = ["handler404", "handler500", "urlpatterns"]

urlpatterns = [path("bench/trivial", TrivialView.as_view(), name="bench-trivial"), *console_urlpatterns]
