"""Console forms: every action's input is validated here before a service is called."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS

from operations import selectors
from operations.idempotency import MAX_SAFE_NUMBER
from operations.models import Intent
from operations.services.approvals import DUPLICATE_RISK_CONFIRMATION


class Acknowledgement(forms.CheckboxInput):
    """A checkbox that counts as ticked only for what a browser or a careful client sends for a
    ticked box (``on``, ``true``, ``1``, ``yes``): Django's default reads any other non-empty
    value, ``off`` included, as True, and an acknowledgement of risk must never be implied."""

    TICKED = frozenset({"on", "true", "1", "yes"})

    def value_from_datadict(self, data: Any, files: Any, name: str) -> bool:
        return str(data.get(name, "")).strip().lower() in self.TICKED


HASH_FIELD = {"min_length": 64, "max_length": 64, "label": "request_hash you reviewed"}


class DecisionForm(forms.Form):
    """Approve or reject: the request_hash the page displayed, and a reason."""

    request_hash = forms.CharField(widget=forms.HiddenInput, **HASH_FIELD)  # type: ignore[arg-type]
    reason = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Reason"
    )


class ApproveForm(DecisionForm):
    """Approve: also the confirmation that a duplicate risk was seen (``intent_approve`` refuses an
    approval without it when other intents for the same reference succeeded or are in flight)."""

    accept_duplicate_risk = forms.BooleanField(
        required=False, widget=Acknowledgement, label=DUPLICATE_RISK_CONFIRMATION
    )
    # The other intents the page listed (comma-separated ids): the confirmation accepts exactly
    # these; ``intent_approve`` refuses when another one appeared since.
    duplicate_risk_seen = forms.CharField(required=False, max_length=20_000, widget=forms.HiddenInput)

    def clean_duplicate_risk_seen(self) -> list[uuid.UUID]:
        raw: str = self.cleaned_data["duplicate_risk_seen"]
        try:
            return [uuid.UUID(part) for part in raw.split(",") if part.strip()]
        except ValueError as exc:
            raise forms.ValidationError("the list of intents the page showed is not a list of ids") from exc

    def accepted_duplicates(self) -> list[uuid.UUID]:
        """The intents the approver accepts a second effect beside: the ones the page listed,
        when the box is ticked; none otherwise."""
        return self.cleaned_data["duplicate_risk_seen"] if self.cleaned_data["accept_duplicate_risk"] else []


class RejectForm(DecisionForm):
    """A rejection needs a reason."""

    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Reason")


class SeenStateForm(forms.Form):
    """A decision on an intent's state: ``seen_seq`` is the last audit event of the intent the page
    showed, so a decision from a page that is out of date is refused (issue 21, a stale tab)."""

    seen_seq = forms.IntegerField(
        min_value=0,
        max_value=MAX_SAFE_NUMBER,
        widget=forms.HiddenInput,
        error_messages={"required": "This page is out of date or incomplete: reload it and decide again."},
    )


class ResolveConfirmedForm(SeenStateForm):
    """The effect exists at the provider: its reference is required."""

    provider_reference = forms.CharField(max_length=200, label="Provider reference")
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Reason")
    accept_unverified = forms.BooleanField(
        required=False,
        widget=Acknowledgement,
        label="I confirm without provider verification: the provider cannot check this reference, "
        "and the intent will show as unverified",
    )


class ResolveAbsentForm(SeenStateForm):
    """The effect did not happen: retry with the same key (acknowledge the duplicate risk where
    the provider cannot deduplicate)."""

    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Reason")
    accept_duplicate_risk = forms.BooleanField(
        required=False,
        widget=Acknowledgement,
        label="I accept the duplicate risk: this provider has no idempotency keys, so a retry may "
        "apply the effect twice if it did happen",
    )


class ResolveCompensateForm(SeenStateForm):
    """Open a compensation intent that undoes or offsets the effect."""

    provider_reference = forms.CharField(
        required=False,
        max_length=200,
        label="Provider reference of the effect to undo",
        help_text="Leave empty to use the one the reconciler found.",
    )
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Reason")


class FindingDecisionForm(forms.Form):
    """A duplicate finding's acknowledge / compensate: a reason (the service refuses a finding
    that is no longer open, under its row lock)."""

    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Reason")


class ReasonForm(SeenStateForm):
    """A decision on an intent that needs only a reason: a failed compensation's reopen /
    compensated / kept, a held intent's reject."""

    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Reason")


class ReleaseHeldForm(SeenStateForm):
    """Release a HELD intent before the rule does: a reason, and the duplicate risk accepted
    (``reconciliation.resolution.release_held`` refuses without it)."""

    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Reason")
    accept_duplicate_risk = forms.BooleanField(
        required=False,
        widget=Acknowledgement,
        label="I accept the duplicate risk: the earlier intent for the same business action is open or "
        "already succeeded, so releasing this one may apply the effect twice",
    )


class AssignForm(forms.Form):
    """ "I'm on it" (nothing to fill in), or a take-over: the name the page showed as being on it
    and a ticked confirmation (a plain form needs no JavaScript to ask "are you sure?")."""

    take_over_from = forms.CharField(required=False, max_length=150, widget=forms.HiddenInput)
    confirm_take_over = forms.BooleanField(
        required=False, widget=Acknowledgement, label="Confirm the take-over"
    )
    reason = forms.CharField(required=False, max_length=2000, label="Reason")

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        owner = cleaned.get("take_over_from", "")
        if owner and not cleaned.get("confirm_take_over"):
            raise forms.ValidationError(
                f"tick the box to confirm that you take it over from {owner}", code="unconfirmed"
            )
        return cleaned


def _sort_field(sorts: dict[str, selectors.Sort]) -> forms.ChoiceField:
    """A list's sort menu: only the keys of ``sorts`` (each served by an index); another value
    is refused with a message naming the default the list falls back to."""
    return forms.ChoiceField(
        required=False,
        choices=selectors.sort_choices(sorts),
        label="Sort",
        error_messages={
            "invalid_choice": "%(value)s is not a sort of this list (choose one from the menu); "
            "shown in the default order instead."
        },
    )


class ListFilterForm(forms.Form):
    """The filters of a list of intents (issue 16 item 3), kept in the URL; every field
    optional. A field that does not validate is left out and named in the page's message; the
    others still filter (``filters_of``)."""

    intent_id = forms.CharField(
        required=False, max_length=40, label="intent_id starts with", help_text="e.g. its first 8 hex digits"
    )
    reference = forms.CharField(
        required=False, max_length=201, label="Reference", help_text="any case; end with * for a prefix"
    )
    tenant = forms.CharField(required=False, max_length=100)
    action = forms.CharField(required=False, max_length=100)
    principal = forms.CharField(
        required=False, max_length=200, label="Requested by", help_text="otto, user:otto or agent:<name>"
    )

    def clean_intent_id(self) -> str:
        value: str = self.cleaned_data["intent_id"].strip()
        if value:
            try:
                selectors.intent_id_range(value)
            except selectors.InvalidFilter as exc:
                raise forms.ValidationError(str(exc)) from exc
        return value


class ApprovalsFilterForm(ListFilterForm):
    """The approvals inbox's filters and sort."""

    sort = _sort_field(selectors.APPROVAL_SORTS)


class UnknownFilterForm(ListFilterForm):
    """The UNKNOWN section's filters and sort."""

    sort = _sort_field(selectors.UNKNOWN_SORTS)


def filters_of(form: forms.Form) -> dict[str, Any]:
    """The filters a bound ``form`` validated, blank ones left out (those that failed are not
    in ``cleaned_data``); ``{}`` for an unbound form."""
    if not form.is_bound:
        return {}
    form.is_valid()
    return {name: value for name, value in form.cleaned_data.items() if value}


class IntentSearchForm(ListFilterForm):
    """The intents search; every field optional."""

    q = forms.CharField(
        required=False,
        max_length=200,
        label="intent_id or reference",
        help_text="whole id, 8+ hex digits, or reference; archived intents also by whole Idempotency-Key",
    )
    status = forms.ChoiceField(required=False, choices=[("", "any")] + list(Intent.Status.choices))
    principal = forms.CharField(
        required=False, max_length=200, label="Principal", help_text="otto, user:otto or agent:<name>"
    )
    created_after = forms.DateTimeField(
        required=False, label="Created from", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    created_before = forms.DateTimeField(
        required=False, label="Created before", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    sort = _sort_field(selectors.INTENT_SORTS)

    field_order = [
        "q",
        "intent_id",
        "reference",
        "tenant",
        "action",
        "status",
        "principal",
        "created_after",
        "created_before",
        "sort",
    ]


class AuditFilterForm(forms.Form):
    """The audit log filters; every field optional."""

    intent_id = forms.UUIDField(required=False, label="intent_id")
    actor = forms.CharField(required=False, max_length=200, help_text="otto, user:otto or agent:<name>")
    event = forms.CharField(required=False, max_length=50)
    created_after = forms.DateTimeField(
        required=False, label="From", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    created_before = forms.DateTimeField(
        required=False, label="Before", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )


def first_error(form: forms.Form) -> str:
    """The first validation error of ``form`` as ``field: message`` (for an in-place notice)."""
    errors: dict[str, Any] = form.errors.get_json_data()
    for name, items in errors.items():
        if name == NON_FIELD_ERRORS:
            return str(items[0]["message"])
        label = form.fields[name].label if name in form.fields else ""
        return f"{label or name}: {items[0]['message']}"
    return "the form is invalid"
