"""The documentation site builds (``mkdocs build --strict``, as .ci/run does), and its generated
reference pages say what the code says: every environment variable the settings read, and every
``manage.py`` command of our apps. The cross-checks find those in the source themselves (regular
expressions, file names), not the way the hook does (``ast``, Django)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists(),
    reason="mkdocs is not installed (pip install -e '.[docs]')",
)


def _mkdocs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module (not strict: the page checks below say what is wrong
    on their own pages even when another page has a broken link)."""
    folder = tmp_path_factory.mktemp("site")
    result = _mkdocs("--site-dir", str(folder))
    assert result.returncode == 0, result.stderr[-4000:]
    return folder


def _text(site: Path, page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", (site / page / "index.html").read_text(encoding="utf-8")))


def test_the_site_builds_strict(tmp_path: Path) -> None:
    # when
    result = _mkdocs("--strict", "--site-dir", str(tmp_path / "site"))
    # then: no warning at all (a missing page, a broken link or anchor, an unknown marker)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "openapi.json").exists()


def _settings_variables() -> set[str]:
    names: set[str] = set()
    sources = [ROOT / "console" / "settings.py", *sorted((ROOT / "console").glob("settings_*.py"))]
    for path in sources:
        source = path.read_text(encoding="utf-8")
        names |= set(re.findall(r"\benv_[a-z_]+\(\s*\"([A-Z][A-Z0-9_]*)\"", source))
        names |= set(re.findall(r"\bos\.(?:environ\.get|getenv)\(\s*\"([A-Z][A-Z0-9_]*)\"", source))
        names |= set(re.findall(r"\bos\.environ\[\s*\"([A-Z][A-Z0-9_]*)\"\s*\]", source))
        # Wrappers of the settings module that read the variable they are given (_rate).
        for wrapper in re.findall(r"^def (\w+)\(name: str", source, re.MULTILINE):
            names |= set(re.findall(rf"\b{wrapper}\(\s*\"([A-Z][A-Z0-9_]*)\"", source))
        # The functions handed the whole environment (security_settings(os.environ)).
        for function in re.findall(r"\b(\w+)\(os\.environ\)", source):
            env_source = (ROOT / "console" / "env.py").read_text(encoding="utf-8")
            body = env_source.split(f"def {function}(", 1)[1].split("\ndef ", 1)[0]
            names |= set(re.findall(r"\benv_[a-z_]+\(\s*\"([A-Z][A-Z0-9_]*)\"", body))
    return names


def test_the_settings_page_lists_every_variable_the_settings_read(site: Path) -> None:
    # given
    variables = _settings_variables()
    assert {
        "DATABASE_URL",
        "DJANGO_SECRET_KEY",
        "EFFECT_LEDGER_HTTPS",
        "EFFECT_LEDGER_RATE_AGENT",
    } <= variables
    # when
    text = _text(site, "reference/settings")
    # then
    missing = sorted(name for name in variables if not re.search(rf"\b{name}\b", text))
    assert not missing, f"not on the settings page: {missing}"


def test_every_variable_on_the_settings_page_has_a_meaning(site: Path) -> None:
    # given: the page's tables (the settings' variables, and those read outside the settings)
    page = (site / "reference" / "settings" / "index.html").read_text(encoding="utf-8")
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.DOTALL)
    assert len(rows) > 50
    # then: every row's last cell (the comment above the read in the source) says something
    empty = []
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)
        if cells and not re.sub(r"<[^>]+>", "", cells[-1]).strip():
            empty.append(re.sub(r"<[^>]+>", "", cells[0]).strip())
    assert not empty, f"no meaning (add a comment above the read in console/settings*.py): {empty}"


def test_the_commands_page_names_every_command(site: Path) -> None:
    # given: every command file of our apps
    commands = sorted(
        path.stem
        for package in ("console", "operations", "reconciliation")
        for path in (ROOT / package).rglob("management/commands/*.py")
        if not path.name.startswith("_")
    )
    assert {"quickstart", "resolve", "create_agent"} <= set(commands)
    # when
    text = _text(site, "reference/commands")
    # then: each has its section, with its own usage line from --help
    for command in commands:
        assert f"usage: manage.py {command}" in text, command


def test_the_api_page_names_every_path_of_the_openapi_document(site: Path) -> None:
    import json

    document = json.loads((site / "reference" / "openapi.json").read_text(encoding="utf-8"))
    text = _text(site, "reference/api")
    for path, methods in document["paths"].items():
        for method in methods:
            assert f"{method.upper()} {path}" in text


def test_the_metrics_page_names_every_metric(site: Path) -> None:
    # Every metric /metrics serves, wherever it is defined: operations/metrics.py, and the gauges
    # the console appends (the provider findings, console/views/dashboard.py).
    source = "\n".join(
        path.read_text(encoding="utf-8")
        for package in ("console", "operations", "reconciliation")
        for path in (ROOT / package).rglob("*.py")
    )
    names = set(
        re.findall(r"(?:Counter|Histogram|Gauge|GaugeMetricFamily)\(\s*\"(effect_ledger_\w+)\"", source)
    )
    assert len(names) > 20 and "effect_ledger_provider_findings_open" in names
    text = _text(site, "reference/metrics")
    for name in names:
        assert re.search(rf"\b{name}(_total)?\b", text), name


def test_the_layout_page_names_every_room_and_module_of_the_ledger(site: Path) -> None:
    # Written independently of docs/hooks/rooms.py: every package and module under operations/
    # (migrations and management commands aside) appears on the explanation of the layout.
    page = _text(site, "explanation/layout")
    operations = ROOT / "operations"
    expected = [
        path.relative_to(ROOT).as_posix()
        for path in operations.rglob("*.py")
        if path.name != "__init__.py"
        and not {"migrations", "management"} & set(path.parts)
        and len(path.relative_to(operations).parts) <= 2
    ]
    assert len(expected) > 50
    missing = [name for name in expected if name not in page]
    assert missing == []
