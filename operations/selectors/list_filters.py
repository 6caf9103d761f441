"""What the console's intent lists share (issue 16 item 3): the filters people type (an intent
id's first hex digits, a reference in any case, a principal by its plain name), the sorts each
list offers, and the "customer/target" an intent affects.

Every filter and sort here stays on an index of ``operations_intent`` (``Intent.Meta.indexes``,
migration 0023), checked by ``tests/console/test_list_plans.py`` against 100,000 rows:

* an intent id prefix is a range of the primary key: ``id BETWEEN prefix+0…0 AND prefix+f…f``;
* a reference is matched on ``UPPER(reference)`` (index ``intent_reference_upper``, built with
  ``text_pattern_ops`` so that ``LIKE 'ABC%'`` is a range of it whatever the collation);
* each sort is the order of an index the list's rows are read from (named per ``Sort``);
* a principal's plain name is an ``IN`` of its two spellings (the audit log's ``audit_actor``
  index; intents have no principal index: that filter narrows the rows another index reads).
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet, Value
from django.db.models.functions import Upper

from operations.adapters.registry import get_adapter
from operations.models import Agent, Intent

#: An intent id is 32 hex digits; people paste it with or without the dashes of its text form.
HEX_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")
#: A reference ending in this character is a prefix ("order-1*": order-1, order-10, ...).
PREFIX_MARK = "*"


class InvalidFilter(ValueError):
    """A filter value that cannot name any row (an intent id with a digit that is not hex).
    ``str()`` says what to type instead."""


def intent_id_range(text: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The lowest and highest intent ids that start with ``text``.

    Args:
        text: the first hex digits of an intent id (1 to 32), with or without its dashes, any
            case: ``"3F2a9C1e"``, ``"3f2a9c1e-8b"``.

    Returns:
        ``(prefix padded with 0s, prefix padded with f's)``: a range of the primary key index
        (a UUID compares as its 16 bytes, so ids starting with ``text`` lie exactly between).

    Raises:
        InvalidFilter: empty, longer than an id, or a character other than 0-9, a-f and dashes.
    """
    digits = text.strip().replace("-", "").lower()
    if not HEX_PREFIX.match(digits):
        raise InvalidFilter(
            "an intent_id is hex digits (0-9, a-f), e.g. its first 8, with or without dashes; "
            f"{text.strip()[:40]!r} is not"
        )
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def principal_names(name: str) -> list[str]:
    """The principals (and audit actors) a name people know can mean: ``"otto"`` ->
    ``["otto", "user:otto", "agent:otto"]``; a name with its kind (``"user:otto"``) means that
    kind only. Principals are ``agent:<name>`` or ``user:<username>`` (``Intent.principal``).

    Names are matched as sign-in matches them (NFKC, any case): ``"OTTO"`` or ``"ｏｔｔｏ"``
    also mean the account stored as ``otto``, read from the users' and agents' tables (small),
    so the filter stays an ``IN`` of exact values on the ``audit_actor`` / principal index."""
    name = unicodedata.normalize("NFKC", name.strip())
    kind, _, bare = name.rpartition(":") if ":" in name else ("", "", name)
    names = {name} if kind else {name, f"user:{name}", f"agent:{name}"}
    if bare and kind in ("", "user"):
        users = get_user_model().objects.filter(username__iexact=bare).values_list("username", flat=True)
        names.update(f"user:{username}" for username in users[:10])
    if bare and kind in ("", "agent"):
        agents = Agent.objects.filter(name__iexact=bare).values_list("name", flat=True)
        names.update(f"agent:{agent}" for agent in agents[:10])
    return sorted(names)


def reference_filter(queryset: QuerySet[Any], text: str, field: str = "reference") -> QuerySet[Any]:
    """``queryset`` narrowed to references equal to ``text`` in any case, or starting with it
    when it ends with ``*`` (``"ORDER-1*"``): both are ranges of ``intent_reference_upper``
    (``UPPER(reference)`` with ``text_pattern_ops``). ``%`` and ``_`` are matched literally
    (Django escapes them in ``startswith``)."""
    text = text.strip()
    queryset = queryset.alias(reference_upper=Upper(field))
    # Upper-cased by PostgreSQL on both sides: Python's upper() differs for some letters
    # ("ß" -> "SS", "ﬁ" -> "FI") and then found nothing (reviewer). UPPER of a constant is folded
    # at plan time, so the comparison is still a range of intent_reference_upper.
    if text.endswith(PREFIX_MARK) and len(text) > 1:
        return queryset.filter(reference_upper__startswith=Upper(Value(text[:-1])))
    return queryset.filter(reference_upper=Upper(Value(text)))


@dataclass(frozen=True)
class Sort:
    """One way to order a list.

    Attributes:
        label: what the sort menu says.
        order_by: the ``order_by`` fields, the last one the id (a total order for the cursor).
        indexes: the indexes that serve it: read in their order (forwards or backwards), or,
            for the few rows of an open state, read whole and sorted (PostgreSQL picks).
    """

    label: str
    order_by: tuple[str, ...]
    indexes: tuple[str, ...]


EXPIRY_INDEXES = ("intent_awaiting_q", "intent_open_status")

#: The approvals inbox (status AWAITING_APPROVAL). Key ``-x``: descending by x.
APPROVAL_SORTS: dict[str, Sort] = {
    "-risk": Sort(
        "Highest risk first, then newest", ("-risk_rank", "-created_at", "id"), ("intent_approvals_inbox",)
    ),
    "risk": Sort(
        "Lowest risk first, then oldest", ("risk_rank", "created_at", "-id"), ("intent_approvals_inbox",)
    ),
    "-created": Sort("Newest first", ("-created_at", "id"), ("intent_status_created",)),
    "created": Sort("Oldest first", ("created_at", "-id"), ("intent_status_created",)),
    # The AWAITING_APPROVAL rows are few (an open state): read from intent_awaiting_q in
    # expiry order, or all of them from intent_open_status and sorted, whichever is cheaper.
    "expiry": Sort("Expiring soonest first", ("approval_expires_at", "id"), EXPIRY_INDEXES),
    "-expiry": Sort("Expiring latest first", ("-approval_expires_at", "-id"), EXPIRY_INDEXES),
}
APPROVAL_DEFAULT_SORT = "-risk"

UNKNOWN_CREATED_INDEXES = (
    "intent_status_created",
    "intent_unknown_q",
    "intent_unknown_age",
    "intent_open_status",
)

#: The UNKNOWN section of the operators' queue (status UNKNOWN). ``updated`` is when the
#: intent became UNKNOWN (its age in the queue).
UNKNOWN_SORTS: dict[str, Sort] = {
    "updated": Sort("UNKNOWN longest first", ("updated_at", "id"), ("intent_unknown_age",)),
    "-updated": Sort("UNKNOWN most recently first", ("-updated_at", "-id"), ("intent_unknown_age",)),
    # The UNKNOWN rows are few (an open state): read in order from intent_status_created, or
    # all of them from one of UNKNOWN's partial indexes and sorted, whichever is cheaper.
    "created": Sort("Submitted earliest first", ("created_at", "-id"), UNKNOWN_CREATED_INDEXES),
    "-created": Sort("Submitted latest first", ("-created_at", "id"), UNKNOWN_CREATED_INDEXES),
}
UNKNOWN_DEFAULT_SORT = "updated"

#: The intents search (keyset pages; the cursor names its sort: ``pagination.encode_cursor``).
INTENT_SORTS: dict[str, Sort] = {
    "-created": Sort("Newest first", ("-created_at", "id"), ("intent_created",)),
    "created": Sort("Oldest first", ("created_at", "-id"), ("intent_created",)),
}
INTENT_DEFAULT_SORT = "-created"


def sort_choices(sorts: dict[str, Sort]) -> list[tuple[str, str]]:
    """``[(key, label)]`` for a sort menu, in the order the list declares them."""
    return [(key, sort.label) for key, sort in sorts.items()]


@dataclass
class ListFilters:
    """What the approvals inbox and the UNKNOWN section narrow by; empty fields do not filter.

    Attributes:
        intent_id: the first hex digits of an intent id (``intent_id_range``).
        reference: a reference in any case, ``*`` at the end for a prefix (``reference_filter``).
        principal: who submitted it, ``user:otto`` or just ``otto`` (``principal_names``).
        sort: a key of the list's sorts; blank for its default.
    """

    intent_id: str = ""
    reference: str = ""
    tenant: str = ""
    action: str = ""
    principal: str = ""
    sort: str = ""


def intents_filtered(queryset: QuerySet[Intent], filters: Any) -> QuerySet[Intent]:
    """``queryset`` narrowed by the ``intent_id``, ``reference``, ``tenant``, ``action`` and
    ``principal`` attributes of ``filters`` (``ListFilters`` or ``IntentFilters``; blank ones
    do not filter).

    Raises:
        InvalidFilter: ``intent_id`` is not hex digits (the forms refuse it first).
    """
    if filters.intent_id:
        low, high = intent_id_range(filters.intent_id)
        queryset = queryset.filter(id__gte=low, id__lte=high)
    if filters.reference:
        queryset = reference_filter(queryset, filters.reference)
    if filters.tenant:
        queryset = queryset.filter(tenant=filters.tenant.strip())
    if filters.action:
        queryset = queryset.filter(action=filters.action.strip())
    if filters.principal:
        queryset = queryset.filter(principal__in=principal_names(filters.principal))
    return queryset


def sorted_by(queryset: QuerySet[Intent], sorts: dict[str, Sort], key: str, default: str) -> QuerySet[Intent]:
    """``queryset`` in the order of ``sorts[key]`` (``sorts[default]`` for a blank or unknown
    key: the forms refuse an unknown one with a message first)."""
    return queryset.order_by(*sorts.get(key, sorts[default]).order_by)


def intent_target(action: str, arguments: Any) -> str:
    """Who or what an intent of ``action`` affects (the customer of a charge, the charge of a
    refund, the recipient of an email, the reserved resource, a generic action's declared
    ``target_field`` or its host), as its adapter declares it (``Adapter.target_for``): the one
    place lists learn it. ``""`` when the action is not served here or names no target; never
    raises (a list must render whatever a stored row holds)."""
    try:
        return get_adapter(action).target_for(action, arguments)
    except Exception:  # an unserved action, a broken adapter or odd stored arguments: no target
        return ""
