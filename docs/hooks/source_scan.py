"""What the reference hooks share: the repository root, the product's packages, a parsed source
file with its parents and lines (read with ``ast``, nothing imported), and the helpers that write
Markdown table cells.

Imported as a sibling module by ``settings_reference.py`` and ``django_reference.py`` (the
directory of the hook is on ``sys.path`` while MkDocs executes it, and when it runs as a script).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The product's packages, scanned for variables read outside the settings.
PRODUCT_PACKAGES = ("console", "operations", "reconciliation")


@dataclass
class SourceModule:
    path: Path
    tree: ast.Module
    lines: list[str]
    parents: dict[int, ast.AST] = field(default_factory=dict)

    @classmethod
    def parse(cls, path: Path) -> SourceModule:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        module = cls(path, tree, source.splitlines())
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                module.parents[id(child)] = node
        return module

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def segment(self, node: ast.AST) -> str:
        text = ast.get_source_segment("\n".join(self.lines), node) or ast.unparse(node)
        return " ".join(line.strip() for line in text.splitlines())

    def relative(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return ast.unparse(func)
    return ""


def const_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def code_cell(text: str) -> str:
    if not text:
        return ""
    ticks = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return cell(f"{ticks}{pad}{text}{pad}{ticks}")


def rst_to_md(text: str) -> str:
    return re.sub(r"``([^`]+)``", r"`\1`", text)
