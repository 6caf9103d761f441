"""MkDocs hook: the rooms of the ledger, written from the code at build time.

A page asks for them with ``<!-- layout: rooms -->`` on a line of its own. For ``operations/``
(and ``reconciliation/``, ``console/``), the table lists each package with the first paragraph
of its ``__init__.py`` docstring, then each module with the first sentence of its own: what the
folder says about the design, read with ``ast`` (nothing imported), so the page cannot drift
from the folders. A module without a docstring is listed with "(no docstring)".
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*layout:\s*rooms\s*-->\s*$", re.MULTILINE)
#: Folders that are not rooms of the design: generated or framework plumbing.
SKIPPED = {"migrations", "management", "templatetags", "__pycache__"}


def _docstring(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return ast.get_docstring(tree) or ""


def _first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n", 1)[0].split())


def _first_sentence(text: str) -> str:
    paragraph = _first_paragraph(text)
    match = re.match(r"(.+?(?<!e\.g)(?<!i\.e)\.)(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def _cell(text: str) -> str:
    """Docstring text as a Markdown table cell: reST ````literals```` as Markdown ones."""
    return text.replace("``", "`").replace("|", "\\|") or "(no docstring)"


def _modules(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.py") if path.name != "__init__.py")


def render_rooms(package: str) -> str:
    """A Markdown table of ``package``'s top-level modules and of each of its rooms
    (subpackages), each room followed by its modules."""
    base = ROOT / package
    rows = ["| room or module | what it holds |", "|---|---|"]
    for module in _modules(base):
        rows.append(f"| `{package}/{module.name}` | {_cell(_first_sentence(_docstring(module)))} |")
    rooms = sorted(p for p in base.iterdir() if (p / "__init__.py").is_file() and p.name not in SKIPPED)
    for room in rooms:
        rows.append(
            f"| **`{package}/{room.name}/`** | **{_cell(_first_paragraph(_docstring(room / '__init__.py')))}** |"
        )
        for module in _modules(room):
            rows.append(
                f"| `{package}/{room.name}/{module.name}` | {_cell(_first_sentence(_docstring(module)))} |"
            )
        for inner in sorted(
            p for p in room.iterdir() if (p / "__init__.py").is_file() and p.name not in SKIPPED
        ):
            rows.append(
                f"| `{package}/{room.name}/{inner.name}/` | "
                f"{_cell(_first_sentence(_docstring(inner / '__init__.py')))} |"
            )
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(lambda _: render_rooms("operations"), markdown)
