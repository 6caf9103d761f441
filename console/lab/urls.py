"""The lab's console pages: drills (crash lab and acceptance evidence, starting a drill)."""

from __future__ import annotations

from django.urls import path

from console.lab import views

urlpatterns = [
    path("drills/", views.drills, name="drills"),
    path("drills/start", views.drill_start, name="drill-start"),
]
