"""Sign-in. Locking after repeated failures is django-axes' (``console.signin``), shared with
the admin's login form."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class ConsoleLoginView(auth_views.LoginView):
    """Django's login view on the console's template; a locked sign-in is answered by
    ``console.signin.lockout_response`` (HTTP 429)."""

    template_name = "console/login.html"
    redirect_authenticated_user = True


login_view = ConsoleLoginView.as_view()


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: Django's refusal of a form posted without a valid CSRF token, on
    the console's own template (Django's default page has an inline style the
    Content-Security-Policy blocks). 403; nothing was done."""
    return render(request, "console/csrf_failure.html", {"reason": reason}, status=403)
