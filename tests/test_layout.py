"""Issue 34 items 2 and 3: the folders show the design, and no product module outgrows a reading.

Issue 14 brought every module under 400 lines; they grew back (21 product modules past it, the
largest 956) and ``operations/`` became 47 modules in one room. These guards keep both from
happening again: a module that grows past the limit is split along a seam before it lands.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("console", "operations", "reconciliation")
#: The most lines a product module may have (migrations are generated and exempt).
MODULE_LINES = 400
#: The most modules ``operations/`` may hold at its top level; the rest live in its rooms.
OPERATIONS_TOP_LEVEL = 20


def product_modules() -> list[Path]:
    return sorted(
        path
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def test_i34_3_no_product_module_is_over_400_lines() -> None:
    modules = product_modules()
    assert len(modules) > 100  # the walk found the product, not an empty folder
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in modules
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES
    }
    assert too_long == {}


def test_i34_2_operations_shows_its_rooms() -> None:
    top_level = sorted(path.name for path in (ROOT / "operations").glob("*.py"))
    assert len(top_level) <= OPERATIONS_TOP_LEVEL, top_level
    rooms = {path.name for path in (ROOT / "operations").iterdir() if (path / "__init__.py").is_file()}
    # The clusters the issue named, each a package of its own.
    assert {"api", "audit", "models", "adapters", "services", "selectors"} <= rooms
    for room in rooms - {"migrations", "management"}:
        init = (ROOT / "operations" / room / "__init__.py").read_text(encoding="utf-8")
        assert init.lstrip().startswith('"""'), f"operations/{room}/__init__.py says what the room holds"
