"""Issue 34 item 1: the README is what a visitor needs on one screen or three, and points into
the documentation site for the rest (it was 2,031 lines, 33 sections, one page)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The two commands of the quick start, exactly as a fresh machine runs them (.ci/run runs the
#: second one as written).
QUICK_START = ("pip install -e . && python manage.py quickstart", "pip install -e '.[test]' && pytest")


def test_i34_1_the_readme_is_at_most_200_lines_with_the_two_commands_a_screenshot_and_the_docs() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for command in QUICK_START:
        assert f"```bash\n{command}\n```" in text
    images = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", text)
    assert images and all((ROOT / image).is_file() for image in images)
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 20  # the tutorial, the how-to guides, the reference and the explanations
    assert [link for link in links if not (ROOT / link).is_file()] == []
    for kind in ("docs/tutorial.md", "docs/how-to/", "docs/reference/", "docs/explanation/"):
        assert any(link.startswith(kind) for link in links), kind


def test_the_test_command_ci_runs_is_the_readmes() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q -e '.[test]' && pytest\n" in ci
