"""How the engine describes what went wrong around a provider call: errors of our own and the
provider's answer as evidence (``operations.engine.protocol`` decides what they mean)."""

from __future__ import annotations

from typing import Any

from django.db import DataError, IntegrityError, NotSupportedError, ProgrammingError
from django.db.utils import DatabaseError

from operations.adapters.base import ExecutionResult
from operations.adapters.bounds import clean_detail, clean_text, reference_problem, unstorable_evidence
from operations.adapters.errors import AdapterError

#: Database errors that a retry cannot fix: the statement itself is wrong.
_STATEMENT_ERRORS = (DataError, IntegrityError, ProgrammingError, NotSupportedError)


def describe(exc: BaseException) -> str:
    """``str(exc)`` made storable; an exception whose ``__str__`` itself fails is named by its
    type (a provider's message must never be what breaks the recording)."""
    try:
        text = str(exc)
    except Exception:
        text = f"<{type(exc).__name__} whose message cannot be read>"
    return clean_text(text or type(exc).__name__)


def transient_error(exc: BaseException) -> bool:
    """Whether a retry may fix ``exc``: the database or the network failed (a lost connection,
    a timeout, a deadlock), not our code or a statement that is wrong."""
    if isinstance(exc, DatabaseError):
        return not isinstance(exc, _STATEMENT_ERRORS)
    return isinstance(exc, OSError | TimeoutError)


def answer_evidence(answer: ExecutionResult | BaseException) -> dict[str, Any]:
    """The provider's answer as storable evidence: for a success its reference (or, when that
    cannot be stored, its sha256, length and prefix), digest and replay flag; for an exception
    its type, message and detail."""
    if isinstance(answer, ExecutionResult):
        reference: Any = answer.provider_reference
        if reference_problem(reference):
            reference = unstorable_evidence(reference)
        return clean_detail(
            {
                "answer": "success",
                "provider_reference": reference,
                "response_digest": answer.response_digest,
                "replayed": answer.replayed,
                "detail": answer.detail,
            }
        )
    detail = answer.detail if isinstance(answer, AdapterError) else {}
    return clean_detail({"answer": type(answer).__name__, "error": describe(answer), "detail": detail})
