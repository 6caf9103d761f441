"""Sign-in with throttling (see ``console.throttle``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console import throttle


class ThrottledLoginView(auth_views.LoginView):
    """Django's login view that refuses further tries after repeated failures (HTTP 429)."""

    template_name = "console/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        username = str(request.POST.get("username", ""))
        if throttle.is_locked(username=username, ip=throttle.client_ip(request)):
            minutes = throttle.WINDOW_SECONDS // 60
            return render(
                request,
                self.template_name,
                {
                    "form": self.get_form(),
                    "throttled": f"Too many failed sign-ins. Try again in up to {minutes} minutes.",
                },
                status=429,
            )
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        throttle.record_failure(username=form.data.get("username", ""), ip=throttle.client_ip(self.request))
        return super().form_invalid(form)

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        throttle.record_success(username=form.get_user().get_username(), ip=throttle.client_ip(self.request))
        return super().form_valid(form)


login_view = ThrottledLoginView.as_view()
