"""CSV statements (issue 19, case C21): the saved mapping, amounts by the currency's exponent,
and every bad file refused with its line and column named and nothing stored."""

from __future__ import annotations

import datetime as dt

import pytest

from reconciliation.models import ProviderFinding, StatementLine, StatementRun
from reconciliation.statement_csv import (
    MAX_UPLOAD_BYTES,
    StatementFileError,
    parse_statement,
    save_mapping,
)
from reconciliation.statement_uploads import statement_upload_accept, statement_upload_import

pytestmark = pytest.mark.django_db

SOURCE = "sandbox-payments"
COLUMNS = {
    "provider_reference": "Charge ID",
    "reference": "Order",
    "amount": "Amount",
    "currency": "Currency",
}
DAY = dt.date(2026, 3, 10)


def upload(data: bytes) -> StatementRun:
    """Upload ``data`` with the saved mapping and import it as the worker would; the run."""
    save_mapping(source=SOURCE, columns=COLUMNS, actor="user:otto")
    accepted = statement_upload_accept(source=SOURCE, day=DAY, data=data, filename="s.csv", actor="user:otto")
    statement_upload_import(upload_id=accepted.id, message_id=accepted.message_id)
    return StatementRun.objects.get(id=accepted.run_id)


def test_c21_amounts_are_decimal_major_units_by_the_currencys_exponent() -> None:
    data = "Charge ID,Order,Amount,Currency\nch_1,o-1,49.90,EUR\nch_2,o-2,125000,JPY\nch_3,o-3,1.234,KWD\nch_4,,,\n"
    entries, rows = parse_statement(data.encode(), COLUMNS)
    assert [(e.provider_reference, e.amount, e.currency) for e in entries] == [
        ("ch_1", 4990, "EUR"),
        ("ch_2", 125000, "JPY"),
        ("ch_3", 1234, "KWD"),
        ("ch_4", None, ""),
    ]
    assert rows[0]["Order"] == "o-1"


def test_c21_a_good_upload_is_a_run_with_its_lines() -> None:
    run = upload(b"Charge ID,Order,Amount,Currency\nch_1,o-1,49.90,EUR\n")
    assert run.origin == "upload" and run.error == "" and run.lines == 1 and run.extra_at_provider == 1
    assert StatementLine.objects.get().raw == {
        "Charge ID": "ch_1",
        "Order": "o-1",
        "Amount": "49.90",
        "Currency": "EUR",
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "the file is empty"),
        (b"Charge ID,Order,Amount,Currency\nch_1,o-\xff1,49.90,EUR\n", "line 2: the file is not UTF-8"),
        (b"\n\n", "the file is empty"),
        (b",,,\nch_1,o,1.00,EUR\n", "line 1: the file has no header"),
        (
            b"Charge,Order,Amount,Currency\nch_1,o-1,49.90,EUR\n",
            "line 1: column 'Charge ID' (mapped to provider_reference)",
        ),
        (
            b"Charge ID,Order,Amount,Currency\nch_1,o-1,49.90,EUR\nch_2,o-2,4.9.0,EUR\n",
            "line 3, column 'Amount'",
        ),
        (
            b"Charge ID,Order,Amount,Currency\nch_1,o-1,49.901,EUR\n",
            "line 2, column 'Amount': '49.901' has more decimals",
        ),
        (b"Charge ID,Order,Amount,Currency\nch_1,o-1,1,000.00,EUR\n", "line 2: more fields than the header"),
        (
            b"Charge ID,Order,Amount,Currency\nch_1,o-1,49.90,EURO\n",
            "line 2, column 'Currency': 'EURO' is not an ISO 4217",
        ),
        (
            b"Charge ID,Order,Amount,Currency\nch_1,o-1,49.90,\n",
            "line 2, column 'Amount': an amount needs a currency",
        ),
        (
            b"Charge ID,Order,Amount,Currency\n,o-1,49.90,EUR\n",
            "line 2, column 'Charge ID': the provider reference is empty",
        ),
        (b"Charge ID,Order\n" + b"ch_1,o\n" * (MAX_UPLOAD_BYTES // 6), "the file is too large"),
    ],
    ids=[
        "empty",
        "not-utf8",
        "blank-lines",
        "no-header",
        "mapped-column-missing",
        "bad-amount",
        "too-many-decimals",
        "extra-field",
        "bad-currency",
        "amount-without-currency",
        "no-provider-reference",
        "too-large",
    ],
)
def test_c21_a_bad_file_is_a_clear_error_and_stores_nothing(data: bytes, message: str) -> None:
    with pytest.raises(
        StatementFileError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        upload(data)
    assert not StatementRun.objects.exists()
    assert not StatementLine.objects.exists() and not ProviderFinding.objects.exists()


def test_c21_no_saved_mapping_is_refused() -> None:
    with pytest.raises(StatementFileError, match="no saved column mapping"):
        statement_upload_accept(source=SOURCE, day=DAY, data=b"a\n", filename="s.csv", actor="user:otto")


def test_c21_a_mapping_without_the_provider_reference_is_refused() -> None:
    with pytest.raises(StatementFileError, match="must name the column of provider_reference"):
        save_mapping(source=SOURCE, columns={"amount": "Amount"}, actor="user:otto")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b"Charge ID,Order,Amount,Currency\nch_1,o-1,92233720368547758.08,EUR\n",
            "line 2, column 'Amount': '92233720368547758.08' is too large",
        ),
        (
            b"Charge ID,Order,Amount,Currency\nch_1,o-1,-92233720368547758.08,EUR\n",
            "line 2, column 'Amount': '-92233720368547758.08' is too large",
        ),
        (b"Charge ID,Order,Amount,Currency\nch_1,o-\x001,49.90,EUR\n", "line 2, column 'Order': a NUL byte"),
        (b"Charge ID,Order,Amount,Currency,No\x00te\nch_1,o,49.90,EUR,x\n", "line 1, column 'No"),
        (b"Charge ID,Order,Amount,Currency\nch_1,o-1,49.90,EUR\nch_2,o-2\n", "line 3: fewer fields"),
        (
            b'Charge ID,Order,Amount,Currency\nch_1,o-1,49.90,EUR\n"ch_2,o-2,1.00,EUR\nch_3,o-3,1.00,EUR\n',
            "line 3: a quoted field opened on this line is never closed",
        ),
        (
            b'Charge ID,Order,Amount,Currency\n"ch_1\nwrapped",o-1,49.90,EUR\n"ch_2,o-2,1.00,EUR\n',
            "line 4: a quoted field opened on this line is never closed",
        ),
    ],
    ids=[
        "amount-too-large",
        "amount-too-small",
        "nul-in-field",
        "nul-in-header",
        "fewer-fields",
        "open-quote",
        "open-quote-after-wrapped",
    ],
)
def test_c21_a_file_the_database_would_refuse_is_refused_first_and_stores_nothing(
    data: bytes, message: str
) -> None:
    with pytest.raises(StatementFileError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        upload(data)
    assert not StatementRun.objects.exists()
    assert not StatementLine.objects.exists() and not ProviderFinding.objects.exists()


def test_c21_a_repeated_header_is_refused_on_line_1() -> None:
    with pytest.raises(StatementFileError, match="^line 1: column 'Order' appears twice in the header"):
        upload(b"Charge ID,Order,Amount,Currency,Order\nch_1,o-1,49.90,EUR,o-2\n")
    assert not StatementRun.objects.exists()


def test_c21_one_effect_listed_twice_is_refused_naming_both_lines() -> None:
    # a charge repeated further down is the same effect, not a second one to refund
    with pytest.raises(StatementFileError, match="^line 4: provider reference 'ch_1' is already on line 2"):
        upload(
            b"Charge ID,Order,Amount,Currency\nch_1,o-1,49.90,EUR\nch_2,o-2,1.00,EUR\nch_1,o-1,49.90,EUR\n"
        )
    assert not StatementRun.objects.exists() and not ProviderFinding.objects.exists()
