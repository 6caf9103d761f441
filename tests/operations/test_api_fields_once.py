"""Issue 37: the API's read-only representations build their fields once per class
(``operations.api.intent_representation.FieldsBuiltOnce``) instead of on every serializer, and
answer exactly what DRF's own field building answers, for every state and action kind."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import fields, serializers

from operations.api.intent_representation import IntentDetailSerializer, IntentSerializer
from operations.engine.protocol import execute_intent
from operations.models import Intent
from tests.factories import charge_arguments, submit
from tests.support.processes import sandbox, sandbox_provider  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def _intents() -> list[Intent]:
    """A READY charge, an email and a reservation, one HELD behind the charge, one awaiting
    approval, one SUCCEEDED with its outcome."""
    charge = submit(arguments=charge_arguments(), reference="ord-1")
    email = submit(action="email.send", arguments={"to": "a@example.com", "subject": "s", "body": "b"})
    booking = submit(
        action="reservations.create",
        arguments={"resource": "room-1", "start": "2030-01-01T10:00:00Z", "seats": 2, "reference": "r-1"},
    )
    held = submit(arguments=charge_arguments(), reference="ord-1")
    gated = submit(arguments=charge_arguments(amount=2_500_000), reference="ord-2")
    done = submit(arguments=charge_arguments(), reference="ord-3")
    assert execute_intent(done.id) == "succeeded"
    intents = [Intent.objects.get(id=i.id) for i in (charge, email, booking, held, gated, done)]
    assert {i.status for i in intents} >= {"READY", "HELD", "AWAITING_APPROVAL", "SUCCEEDED"}
    return intents


def _as_drf_builds_them(serializer: Any) -> Any:
    """``serializer`` with DRF's own ``get_fields`` (every field built anew)."""
    serializer.get_fields = lambda: serializers.ModelSerializer.get_fields(serializer)
    return serializer


def test_i37_the_fields_built_once_answer_what_drf_s_own_answer(sandbox: Any) -> None:  # noqa: F811
    for intent in _intents():
        for cls in (IntentSerializer, IntentDetailSerializer):
            built_once = cls(intent).data
            assert built_once == _as_drf_builds_them(cls(intent)).data, (cls.__name__, intent.status)
            assert built_once == cls(intent).data  # and again, from the copies


def test_i37_a_second_representation_builds_no_field(
    sandbox: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: an intent with an outcome, represented once
    intent = _intents()[-1]
    IntentDetailSerializer(intent).data  # noqa: B018
    built: list[str] = []
    init = fields.Field.__init__

    def counted(self: fields.Field[Any, Any, Any, Any], *args: Any, **kwargs: Any) -> None:
        if not isinstance(self, serializers.BaseSerializer):  # a serializer is a field too
            built.append(type(self).__name__)
        init(self, *args, **kwargs)

    monkeypatch.setattr(fields.Field, "__init__", counted)
    # when: represented again (as every API answer does)
    IntentDetailSerializer(intent).data  # noqa: B018
    # then: no field was constructed (before: every field of the intent and its outcome, each time)
    assert built == []
