"""The trivial DRF view the API benchmark compares ``POST /api/v1/intents`` against."""

from __future__ import annotations

from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class TrivialView(APIView):
    """``POST`` on the same stack (agent token authentication, strict JSON parser, JSON
    renderer) that stores nothing: the floor for what a request costs."""

    def post(self, request: Request) -> Response:
        """Echo the parsed body's keys with 201."""
        return Response({"keys": sorted(request.data)}, status=status.HTTP_201_CREATED)
