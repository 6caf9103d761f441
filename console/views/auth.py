"""Sign-in. Locking after repeated failures is django-axes' (``console.signin``), shared with
the admin's login form."""

from __future__ import annotations

from django.contrib.auth import views as auth_views


class ConsoleLoginView(auth_views.LoginView):
    """Django's login view on the console's template; a locked sign-in is answered by
    ``console.signin.lockout_response`` (HTTP 429)."""

    template_name = "console/login.html"
    redirect_authenticated_user = True


login_view = ConsoleLoginView.as_view()
