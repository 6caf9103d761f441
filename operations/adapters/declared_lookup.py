"""Reading a declared provider's answer to "did this intent's effect happen?" (issue 33).

The contract's ``lookup`` (``operations.adapters.contract.Lookup``) says where to ask and where
each fact lives in the answer; this module asks once and reads it:

* 404: ABSENT when the read path is authoritative and finds one effect by our key or our id,
  else NOT_FOUND_YET (a listing's or a lagging read path's silence proves nothing). 410:
  WITHDRAWN. Any other non-2xx, a transport failure, an answer that is not JSON, a list pointer
  that points at no list: INCONCLUSIVE, never read as absence.
* 2xx: the effects are the list at ``items`` (or the answer itself). An effect is this intent's
  when its ``idempotency_key`` field equals our key; without that field, when its
  ``reference`` equals our business reference (a listing by reference); without either, every
  listed effect is (the URL itself selects, e.g. ``/v1/transfers/{idempotency_key}``). It proves
  the effect when its ``status`` is among ``proving_statuses`` (any status when none are given).
  FOUND with every proving effect's id in the order the provider lists them (Stripe: newest
  first; on duplicates the effect on record is kept, else the first listed; two or more: duplicates at a
  provider that does not deduplicate); none: as for a 404.
"""

from __future__ import annotations

from typing import Any, cast

from operations.adapters import http_classifier as answers
from operations.adapters import http_support as http
from operations.adapters.base import ExecutionCall, LookupResult, LookupStatus
from operations.adapters.contract import Lookup
from operations.adapters.errors import AdapterError
from operations.adapters.json_pointer import resolve_pointer
from operations.adapters.templates import TemplateValueMissing, render_url
from operations.strict_json import loads_strict

#: The most effects' statuses a lookup's detail keeps (the detail is stored on the run).
DETAIL_ITEMS = 20


def body_reference(value: Any) -> str | None:
    """The provider's id for an effect as found in its JSON body: a string as is, an integer
    as its decimal text, None when absent or empty. Any other value (an object, a list, a
    float, a boolean) is passed on unchanged, typed as text only nominally, so that the engine's
    and the lookups' one check (``operations.adapters.bounds.reference_problem``) records it as an
    unstorable reference (UNKNOWN, escalated; an inconclusive lookup) instead of a Python repr
    standing in for an id the provider never gave."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return cast(str, value)


def _inconclusive(**detail: Any) -> LookupResult:
    return LookupResult(status=LookupStatus.INCONCLUSIVE, detail=detail)


def _nothing(lookup: Lookup, **detail: Any) -> LookupResult:
    proof = lookup.authoritative and lookup.by in ("key", "id")
    return LookupResult(status=LookupStatus.ABSENT if proof else LookupStatus.NOT_FOUND_YET, detail=detail)


def _text(item: dict[str, Any], lookup: Lookup, name: str) -> str | None:
    pointer = lookup.fields.get(name)
    if pointer is None:
        return None
    value = resolve_pointer(item, pointer)
    return None if value is None else str(value)


def _effects(lookup: Lookup, body: Any) -> list[Any] | None:
    """The listed effects, or None when the answer has no list where the contract says."""
    if lookup.legacy:  # {"data": [...]} or one object
        listed = body.get("data") if isinstance(body, dict) else None
        return listed if isinstance(listed, list) else [body]
    if lookup.items is None:
        return [body]
    listed = resolve_pointer(body, lookup.items)
    return listed if isinstance(listed, list) else None


def read_lookup(
    lookup: Lookup,
    call: ExecutionCall,
    values: dict[str, Any],
    *,
    headers: dict[str, str],
    deadline_seconds: float,
) -> LookupResult:
    """Ask the provider (GET the rendered ``lookup.url``) and read its answer (module docstring).

    Args:
        values: what the URL template may name (the call's arguments and values).
        headers: the request's headers, credentials included.
        deadline_seconds: the whole call's bound, in seconds.

    Returns:
        the ``LookupResult``; its detail holds the HTTP status, how many effects were listed and
        matched, and up to ``DETAIL_ITEMS`` statuses by id; INCONCLUSIVE (``no_reference``) for
        a listing by reference of an intent without one, unless the items carry our key (then
        they are matched by it). Never raises.
    """
    reference = str(values.get("reference") or "")
    if lookup.by == "reference" and not reference and "idempotency_key" not in lookup.fields:
        # Without our reference a listing by reference cannot tell ours; with our key in each
        # item (Stripe's metadata) it still can, whatever the URL lists by.
        return _inconclusive(code="no_reference")
    try:
        url = render_url(lookup.url, values)
        answer = http.send("GET", url, deadline_seconds=deadline_seconds, headers=headers)
    except TemplateValueMissing as exc:
        return _inconclusive(code="template_value_missing", error=str(exc)[:300])
    except AdapterError as exc:
        return _inconclusive(**{**exc.detail, "error": str(exc)[:300]})
    if answer.status_code == 404:
        return _nothing(lookup, status=404)
    if answer.status_code == 410:
        return LookupResult(status=LookupStatus.WITHDRAWN, detail={"status": 410})
    if not answer.is_success:
        return _inconclusive(status=answer.status_code, code=answers.error_code(answer))
    try:
        body = loads_strict(answer.content)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _inconclusive(status=answer.status_code, code="unreadable_success")
    effects = _effects(lookup, body)
    if effects is None or (lookup.legacy and not isinstance(body, dict)):
        return _inconclusive(status=answer.status_code, code="unreadable_list")
    # the pre-issue-33 lookup_url: one object answered counts even without an id (found by our key)
    any_object = lookup.legacy and len(effects) == 1 and effects[0] is body
    found: list[str | None] = []
    statuses: dict[str, str | None] = {}
    for item in effects:
        if not isinstance(item, dict):
            continue
        key, ref = _text(item, lookup, "idempotency_key"), _text(item, lookup, "reference")
        if key is not None or "idempotency_key" in lookup.fields:
            if key != call.idempotency_key:
                continue
        elif "reference" in lookup.fields and ref != reference:
            continue
        status = _text(item, lookup, "status")
        provider_id = body_reference(resolve_pointer(item, lookup.fields["id"]))
        if len(statuses) < DETAIL_ITEMS:
            statuses[str(provider_id)] = status
        if lookup.proving_statuses and status not in lookup.proving_statuses:
            continue
        if provider_id is not None or any_object:
            found.append(provider_id)
    detail = {"status": answer.status_code, "listed": len(effects), "statuses": statuses}
    if not found:
        return _nothing(lookup, **detail)
    references = tuple(i for i in found if i is not None)
    return LookupResult(status=LookupStatus.FOUND, provider_references=references, detail=detail)
