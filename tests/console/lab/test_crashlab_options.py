"""``manage.py crashlab`` refuses, before anything starts, options it would ignore or could only
fail on after the run (issue 35): two modes at once, a drill's size for a drill that does not run,
an output file that cannot be written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from console.lab import cluster


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any process the command would start (sandbox, worker, beat) fails the test instead."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a refused command started a process")

    monkeypatch.setattr(cluster.Process, "__init__", refuse)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--partition", "--failover"], "--partition and --failover exclude each other"),
        (["--partition", "--acceptance"], "--partition and --acceptance exclude each other"),
        (["--partition", "--drill-only"], "--partition and --drill-only exclude each other"),
        (["--failover", "--restore-only"], "--failover and --restore-only exclude each other"),
        (["--drill-only", "--restore-only"], "--drill-only and --restore-only exclude each other"),
        (["--acceptance", "--judge", "x.json"], "--acceptance and --judge exclude each other"),
        (["--partition", "--restore-only", "--judge", "x.json"],
         "--partition and --restore-only and --judge exclude each other"),
    ],
)  # fmt: skip
def test_i35_crashlab_refuses_two_modes_at_once(args: list[str], message: str) -> None:
    # when / then: refused naming the options, before any process or database row
    with pytest.raises(CommandError, match=message):
        call_command("crashlab", *args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--failover-intents", "3"], "--failover-intents sets the failover drill's size, but the crash matrix"),
        (["--partition", "--failover-intents", "3"], "--failover-intents .* but --partition"),
        (["--restore-only", "--drill-intents", "2"], "--drill-intents .* but --restore-only"),
        (["--drill-only", "--restore-intents", "3"], "--restore-intents .* but --drill-only"),
        (["--no-restore", "--restore-intents", "3"], "--restore-intents .* runs no restore drill"),
        (["--no-variants", "--drill-intents", "2"], "--drill-intents sets the duplicate drill's size, but the crash matrix"),
    ],
)  # fmt: skip
def test_i35_crashlab_refuses_a_drill_size_for_a_drill_that_does_not_run(
    args: list[str], message: str
) -> None:
    # when / then
    with pytest.raises(CommandError, match=message):
        call_command("crashlab", *args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json", "/nonexistent/dir/x.json"], "--json /nonexistent/dir/x.json: the folder /nonexistent/dir does not exist"),
        (["--markdown", "/nonexistent/dir/x.md"], "--markdown /nonexistent/dir/x.md: the folder"),
        (["--partition", "--json", "/nonexistent/dir/x.json"], "--json /nonexistent/dir/x.json: the folder"),
        (["--acceptance", "--json", "/nonexistent/dir/x.json"], "--json /nonexistent/dir/x.json: the folder"),
        (["--failover", "--json", "/nonexistent/dir/x.json"], "--json /nonexistent/dir/x.json: the folder"),
        (["--partition", "--markdown", "x.md"], "--markdown is not written by --partition"),
        (["--judge", "x.json", "--json", "y.json"], "--json is not written by --judge"),
    ],
)  # fmt: skip
def test_i35_crashlab_refuses_an_output_it_cannot_write_before_the_run(args: list[str], message: str) -> None:
    # when / then: refused at once, not after the drill printed its result
    with pytest.raises(CommandError, match=message):
        call_command("crashlab", *args)


def test_i35_crashlab_refuses_a_folder_as_its_report_file(tmp_path: Path) -> None:
    # when / then
    with pytest.raises(CommandError, match="is a directory, not a file"):
        call_command("crashlab", "--json", str(tmp_path))
