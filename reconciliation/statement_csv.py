"""Statements uploaded as CSV (issue 19), for sources without a statement API, and the saved
column mapping of each source (``StatementMapping``).

The file is read with Python's ``csv`` module (``csv.DictReader``: the first row is the header,
RFC 4180 quoting). The source's mapping says which header holds each statement field
(``FIELDS``); ``provider_reference`` must be mapped, the others may be left out. A source
without a saved mapping is read with the default one (``default_mapping``: columns named like
the fields) when the file's header has a ``provider_reference`` column.

**Amounts are decimal major units** (``49.90`` EUR, ``125000`` JPY, ``1.234`` KWD), the form
providers' dashboards export, converted to minor units by the line's currency's ISO 4217
exponent (``operations.money.exponent``; Babel's CLDR data). An amount with more decimals than
its currency has (``49.901`` EUR), thousands separators, a sign other than a leading ``-`` or
an amount without a currency is refused; an empty amount means the effect moves no money.

A bad file is refused whole, with the line (the physical line its record starts on, the header
is line 1) and the column named, before anything is stored (not even a run: everything the
database would refuse is caught here first): not UTF-8, empty, no header, a header naming a
column twice, a mapped column missing from the header, a row with fewer or more fields than the
header, a quoted field never closed, a NUL byte in any field, an empty provider reference, a
bad amount or currency, an amount that does not fit a ``bigint`` (``|amount| < 2**63`` minor
units), too large (``MAX_UPLOAD_BYTES``, ``MAX_LINES``).
"""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal
from typing import Any

from django.db import transaction

from operations.adapters.base import StatementEntry
from operations.audit.trail import audit_append_unattached
from operations.money import exponent, is_currency
from reconciliation.models import StatementMapping

#: The statement fields a mapping names columns for; ``provider_reference`` is required.
FIELDS = ("provider_reference", "idempotency_key", "reference", "amount", "currency")
REQUIRED_FIELDS = ("provider_reference",)
#: The mapping of a source without a saved one: each field's column is named like the field
#: (the header ``provider_reference,idempotency_key,reference,amount,currency``; only
#: ``provider_reference`` must be there). Offered in the console's mapping form until one is saved.
DEFAULT_COLUMNS = {field: field for field in FIELDS}
#: The largest file accepted, in bytes (5 MiB), and the most lines.
MAX_UPLOAD_BYTES = 5 * 1024 * 1024
MAX_LINES = 100_000

#: Amounts in minor units are stored as a PostgreSQL ``bigint``: ``|amount| < 2**63``.
MAX_MINOR_UNITS = 2**63

_AMOUNT = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")


class StatementFileError(ValueError):
    """The file or mapping cannot be used; ``str()`` names the line and column, for operators."""


def mapping_problem(columns: Any) -> str | None:
    """Why ``columns`` (``{field: header}``) is not a usable mapping, or None when it is."""
    if not isinstance(columns, dict):
        return "a mapping is an object of statement field to CSV header"
    unknown = sorted(set(columns) - set(FIELDS))
    if unknown:
        return f"unknown statement fields {', '.join(unknown)}; the fields are {', '.join(FIELDS)}"
    for field in REQUIRED_FIELDS:
        if not columns.get(field):
            return f"the mapping must name the column of {field}"
    for field, header in columns.items():
        if not isinstance(header, str) or len(header) > 200:
            return f"the column of {field} must be a header name of at most 200 characters"
        if "\x00" in header:  # PostgreSQL stores no NUL in text or JSON
            return f"the column of {field} holds a NUL character"
    headers = [h for h in columns.values() if h]
    if len(headers) != len(set(headers)):
        return "two fields are mapped to the same column"
    return None


def default_mapping(data: bytes) -> dict[str, str] | None:
    """The mapping a file is read with when its source has none saved: each field whose name is
    a column of the file's header is read from that column (``DEFAULT_COLUMNS``), or None when
    the header has no ``provider_reference`` column (or cannot be read)."""
    try:
        header = next(csv.reader(io.StringIO(data.decode("utf-8-sig"), newline="")), [])
    except (UnicodeDecodeError, csv.Error):
        return None
    named = set(header)
    if not all(field in named for field in REQUIRED_FIELDS):
        return None
    return {field: column for field, column in DEFAULT_COLUMNS.items() if column in named}


def mapping_of(source: str) -> dict[str, str] | None:
    """The saved mapping of ``source`` (``{field: header}``, empty headers left out), or None."""
    saved = StatementMapping.objects.filter(source=source).first()
    if saved is None:
        return None
    return {field: header for field, header in saved.columns.items() if header}


def save_mapping(*, source: str, columns: dict[str, str], actor: str) -> StatementMapping:
    """Save ``source``'s column mapping (``{field: header}``; an empty header leaves a field out),
    audited as ``statement_mapping_saved`` on the chain of events without an intent.

    Raises:
        StatementFileError: the mapping is not usable (``mapping_problem``).
    """
    cleaned = {field: (columns.get(field) or "").strip() for field in FIELDS}
    problem = mapping_problem(cleaned)
    if problem:
        raise StatementFileError(problem)
    with transaction.atomic():
        mapping, _ = StatementMapping.objects.update_or_create(
            source=source, defaults={"columns": cleaned, "updated_by": actor}
        )
        # A mapping belongs to no intent: audited on the chain of events without an intent.
        audit_append_unattached(
            event="statement_mapping_saved", actor=actor, data={"source": source, "columns": cleaned}
        )
    return mapping


def _amount(text: str, currency: str, where: str) -> int:
    if not currency:
        raise StatementFileError(f"{where}: an amount needs a currency on the same line")
    if not _AMOUNT.match(text):
        raise StatementFileError(
            f"{where}: {text[:40]!r} is not an amount (decimal major units like 49.90, no separators)"
        )
    value = Decimal(text)
    digits = exponent(currency)
    minor = value.scaleb(digits)
    if minor != minor.to_integral_value():
        raise StatementFileError(f"{where}: {text!r} has more decimals than {currency} has ({digits})")
    if abs(minor) >= MAX_MINOR_UNITS:
        raise StatementFileError(
            f"{where}: {text[:40]!r} is too large: at most {MAX_MINOR_UNITS - 1} minor units either way"
        )
    return int(minor)


def statement_text(data: bytes) -> str:
    """The file's text (UTF-8, a byte-order mark dropped): the checks that come before any
    mapping, so an empty or mis-encoded file is told so whatever its source's mapping.

    Raises:
        StatementFileError: too large (``MAX_UPLOAD_BYTES``), empty (blank lines only), or not
            UTF-8 (the line and byte named).
    """
    if len(data) > MAX_UPLOAD_BYTES:
        raise StatementFileError(f"the file is too large: {len(data)} bytes, at most {MAX_UPLOAD_BYTES}")
    if not data.strip():
        raise StatementFileError("the file is empty")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise StatementFileError(f"line {line}: the file is not UTF-8 (byte {exc.start + 1})") from exc


def parse_statement(
    data: bytes, columns: dict[str, str]
) -> tuple[list[StatementEntry], list[dict[str, str]]]:
    """Read a CSV statement with ``columns`` (``{field: header}``).

    Returns:
        one ``StatementEntry`` per data line (amounts in minor units) and the rows as read.

    Raises:
        StatementFileError: the first problem, naming the line and column (module docstring).
    """
    text = statement_text(data)
    problem = mapping_problem(columns)
    if problem:
        raise StatementFileError(f"the saved mapping is not usable: {problem}")
    # csv.reader, not DictReader: a short row, a repeated header and the line a record starts on
    # must be seen (DictReader pads, merges and reports the line a record ends on).
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, [])
    except csv.Error as exc:
        raise StatementFileError(f"line 1: the header cannot be read: {_csv_problem(exc)}") from exc
    if not header or not any(h.strip() for h in header):
        raise StatementFileError("line 1: the file has no header")
    _check_header(header, columns)
    entries: list[StatementEntry] = []
    rows: list[dict[str, str]] = []
    seen_at: dict[str, int] = {}  # provider reference -> the line it was first on
    ended = reader.line_num  # the physical line the last record read ends on
    try:
        for fields in reader:
            first_line, ended = ended + 1, reader.line_num
            if not fields:  # a blank line
                continue
            where_line = f"line {first_line}"
            if len(rows) >= MAX_LINES:
                raise StatementFileError(f"{where_line}: too many lines, at most {MAX_LINES}")
            if len(fields) > len(header):
                raise StatementFileError(f"{where_line}: more fields than the header has")
            if len(fields) < len(header):
                raise StatementFileError(
                    f"{where_line}: fewer fields than the header has ({len(fields)} of {len(header)})"
                )
            row = dict(zip(header, fields, strict=True))
            for name, value in row.items():
                if "\x00" in value:  # PostgreSQL stores no NUL in text or JSON
                    raise StatementFileError(f"{where_line}, column {name[:60]!r}: a NUL byte is not text")
            entry = _entry(row, columns, where_line)
            first = seen_at.setdefault(entry.provider_reference, first_line)
            if first != first_line:  # one effect listed twice is not a second effect
                raise StatementFileError(
                    f"{where_line}: provider reference {entry.provider_reference[:60]!r} is already on line {first}"
                )
            entries.append(entry)
            rows.append(row)
    except csv.Error as exc:
        raise StatementFileError(f"line {ended + 1}: {_csv_problem(exc)}") from exc
    return entries, rows  # a header alone is a day without effects: every SUCCEEDED intent is missing


def _csv_problem(exc: csv.Error) -> str:
    """What ``csv`` could not read, for operators (a record's first line is named by the caller)."""
    if "unexpected end of data" in str(exc):
        return "a quoted field opened on this line is never closed"
    return f"the CSV cannot be read: {exc}"


def _check_header(header: list[str], columns: dict[str, str]) -> None:
    """Refuse a header with a NUL, a repeated name (which column would be read?) or without a
    mapped column; the header is line 1."""
    seen: set[str] = set()
    for name in header:
        if "\x00" in name:
            raise StatementFileError(f"line 1, column {name[:60]!r}: a NUL byte is not text")
        if name in seen:
            raise StatementFileError(f"line 1: column {name[:60]!r} appears twice in the header")
        seen.add(name)
    for field, column in columns.items():
        if column and column not in seen:
            raise StatementFileError(
                f"line 1: column {column!r} (mapped to {field}) is not in the header; it has "
                + ", ".join(repr(h) for h in header)
            )


def _entry(row: dict[str, str], columns: dict[str, str], where_line: str) -> StatementEntry:
    """One data row as a ``StatementEntry`` (amounts in minor units), or the first problem."""
    values = {field: row[column].strip() for field, column in columns.items() if column}
    if not values.get("provider_reference"):
        raise StatementFileError(
            f"{where_line}, column {columns['provider_reference']!r}: the provider reference is empty"
        )
    currency = values.get("currency", "")
    if currency and not is_currency(currency):
        raise StatementFileError(
            f"{where_line}, column {columns['currency']!r}: {currency[:20]!r} is not an ISO 4217 currency code"
        )
    amount = None
    if values.get("amount"):
        amount = _amount(values["amount"], currency, f"{where_line}, column {columns['amount']!r}")
    for field, limit in (("provider_reference", 200), ("idempotency_key", 255), ("reference", 200)):
        if len(values.get(field, "")) > limit:
            raise StatementFileError(
                f"{where_line}, column {columns[field]!r}: longer than {limit} characters"
            )
    return StatementEntry(
        provider_reference=values["provider_reference"],
        idempotency_key=values.get("idempotency_key", ""),
        reference=values.get("reference", ""),
        amount=amount,
        currency=currency,
    )
