"""Gunicorn settings for the web server: ``gunicorn -c python:console.gunicorn_conf console.wsgi``.

Gunicorn on its own believes ``X-Forwarded-Proto: https`` (and ``X-Forwarded-Ssl``,
``X-Forwarded-Protocol``) from 127.0.0.1 and ::1 and marks such a request secure before Django
sees it, so a proxy on the same host that passes a client's header through would let that client
keep a browser on plain http while Django thinks it is https (no redirect, the sign-in form posted
in clear). Here gunicorn believes none of them unless ``EFFECT_LEDGER_TRUST_X_FORWARDED_PROTO``
is on, and then only ``X-Forwarded-Proto`` from the addresses in ``FORWARDED_ALLOW_IPS``
(gunicorn's own setting; default 127.0.0.1 and ::1). Django reads the same switch
(``console.env.security_settings``).

Workers are ``gthread``: each serves ``EFFECT_LEDGER_WEB_THREADS`` requests at once (default 8),
because ``GET /api/v1/intents/{id}?wait=SECONDS`` holds its thread for up to 30 s (and no
database connection meanwhile: ``operations.api.waiting``). A sync worker would serve nothing else
while one request waits. Each thread has its own Django connection while it serves a request.
"""

from __future__ import annotations

import os

from console.env import env_bool, env_int

_trusted = env_bool("EFFECT_LEDGER_TRUST_X_FORWARDED_PROTO", False)

secure_scheme_headers = {"X-FORWARDED-PROTO": "https"} if _trusted else {}
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1") if _trusted else ""

# gunicorn's own settings (docs, "Settings": worker_class, threads); a command line's -k or
# --threads still wins.
worker_class = "gthread"
threads = env_int("EFFECT_LEDGER_WEB_THREADS", 8, minimum=1)
