"""What every console view shares: typed htmx requests and the answer to a refused action."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django_htmx.middleware import HtmxDetails

FRAGMENT_HEADER = "X-Console-Fragment"


class HtmxHttpRequest(HttpRequest):
    """An ``HttpRequest`` with django-htmx's ``request.htmx``."""

    htmx: HtmxDetails


def page_or_partial(
    request: HtmxHttpRequest, template: str, partial: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    """Render the whole page, or only ``template#partial`` for an htmx request.

    Fragments carry ``X-Console-Fragment: 1``: ``static/console/console.js`` swaps such a
    fragment in place even when its status is 4xx (a refusal with its reason), and shows any
    other failed response (a CSRF failure, a 500) as a notice instead of swapping it in.
    """
    if request.htmx:
        response = render(request, f"{template}#{partial}", context, status=status)
        response[FRAGMENT_HEADER] = "1"
        return response
    return render(request, template, context, status=status)
