"""Issue 37 (found by the newcomer): the bench's commits per intent counts every commit, also
those of a session that flushed its statistics less than a second before going idle."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from console.lab.bench.database import db_counters, server_dsn, settle_stats

pytestmark = pytest.mark.django_db(transaction=True)


def test_i37_the_bench_counts_the_commits_of_a_session_that_had_just_flushed_its_statistics() -> None:
    dbname = str(connection.settings_dict["NAME"])
    with psycopg.connect(server_dsn(dbname), autocommit=True) as busy:
        # given: a session whose statistics were flushed a moment ago (idle after a second's pause)
        time.sleep(1.1)
        busy.execute("SELECT 1")
        time.sleep(0.2)
        settle_stats(0.0)
        before = db_counters(dbname)
        # when: it commits 20 times at once, then idles, as a web worker between requests does
        for _ in range(20):
            busy.execute("SELECT 1")
        settle_stats()
        after = db_counters(dbname)
    # then: all 20 are counted (PostgreSQL held them back up to 10 s; 1.2 s of waiting saw none)
    assert after.minus(before).commits >= 20
