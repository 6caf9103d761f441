"""WSGI entry point (gunicorn console.wsgi)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

# The settings module Django loads, unless the environment names another.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
application = get_wsgi_application()
