"""The settings reference (``<!-- generated: settings -->``): every environment variable the
settings read, found with ``ast`` (nothing imported) in ``console/settings.py`` and any
``console/settings_*.py``, with its type, default, the setting it fills and its meaning (the
comments and docstrings around the read; the rules are in ``generated.py``'s docstring), and a
second table of the variables the rest of the product reads itself.

Runs in the MkDocs process; part of the hook ``generated.py``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from source_scan import (
    PRODUCT_PACKAGES,
    ROOT,
    SourceModule,
    call_name,
    cell,
    code_cell,
    const_str,
    rst_to_md,
)

#: The helpers of console/env.py that read one variable, and what each gives when unset.
ENV_HELPERS = {
    "env_str": ("string", '""'),
    "env_int": ("integer", None),
    "env_float": ("number", None),
    "env_period": ("seconds, at least 0.1", None),
    "env_bool": ("boolean", None),
    "env_list": ("comma-separated list", None),
    "env_json_file": ("path of a JSON file", "unset: {}"),
}


@dataclass
class EnvRead:
    """One place the code reads an environment variable."""

    name: str
    kind: str
    default: str
    meaning: str
    target: str
    where: str


def _is_os_environ(node: ast.AST) -> bool:
    return ast.unparse(node) in {"os.environ", "environ"}


def _comment_block_above(lines: list[str], lineno: int) -> list[str]:
    """The ``#`` lines directly above line ``lineno`` (1-based), in order, without the ``#``."""
    block: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        text = lines[index].strip().lstrip("#").strip().removeprefix(":").strip()
        if not text.startswith("---"):  # a section heading (``# --- Celery``), not a meaning
            block.insert(0, text)
        index -= 1
    return block


def _group_comment_above(lines: list[str], lineno: int, names: list[str]) -> list[str]:
    """The comment block above the consecutive code lines that ``lineno`` ends, when it names
    one of ``names`` (a comment that introduces a group of entries, e.g. the health thresholds)."""
    index = lineno - 2
    while index >= 0:
        text = lines[index].strip()
        if not text:
            return []
        if text.startswith("#"):
            block = _comment_block_above(lines, index + 2)
            joined = " ".join(block)
            if any(re.search(rf"\b{re.escape(name)}\b", joined) for name in names if name):
                return block
            return []
        index -= 1
    return []


def _docstring_paragraph(doc: str | None, name: str) -> str:
    if not doc:
        return ""
    for paragraph in re.split(r"\n\s*\n|\n\s*- ", doc):
        if f"``{name}``" in paragraph or re.search(rf"\b{re.escape(name)}\b", paragraph):
            return " ".join(paragraph.split()).lstrip("- ")
    return ""


def _statement_of(module: SourceModule, node: ast.AST) -> tuple[ast.AST, str]:
    """The line-owning node of a read (a dictionary entry's key, else the statement) and the
    setting it fills: ``EFFECT_LEDGER["LEASE_SECONDS"]``, ``DEBUG``, ..."""
    child: ast.AST = node
    parent = module.parent(node)
    dict_keys: list[str] = []
    owner: ast.AST | None = None
    while parent is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.Dict) and child in parent.values:
            key = parent.keys[parent.values.index(child)]  # type: ignore[arg-type]
            if key is not None:
                dict_keys.insert(0, ast.unparse(key))
                if owner is None:
                    owner = key
        child, parent = parent, module.parent(parent)
    statement = parent if parent is not None else node
    target = ""
    function = _enclosing_function(module, node)
    if function is not None:
        target = f"{function.name}()"
    elif isinstance(statement, ast.Assign | ast.AnnAssign):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        target = ast.unparse(targets[0])
    target += "".join(f"[{key}]" for key in dict_keys)
    return (owner or statement), target


def _enclosing_function(module: SourceModule, node: ast.AST) -> ast.FunctionDef | None:
    parent = module.parent(node)
    while parent is not None:
        if isinstance(parent, ast.FunctionDef):
            return parent
        parent = module.parent(parent)
    return None


def _meaning(module: SourceModule, node: ast.AST, name: str, target: str) -> str:
    owner, _ = _statement_of(module, node)
    lineno = getattr(owner, "lineno", getattr(node, "lineno", 1))
    own = getattr(node, "lineno", lineno)
    # A read on a line of its own inside a statement (a keyword argument such as
    # ``conn_max_age=env_int(...)``, an argument of a wrapping call) may carry its own comment.
    block = _comment_block_above(module.lines, own) if own != lineno else []
    if not block:
        block = _comment_block_above(module.lines, lineno)
    if not block:
        # The dictionary keys of the target (``EFFECT_LEDGER['WEBHOOK_BATCH']``) count as names.
        keys = [name, *re.findall(r"\[['\"]([A-Z0-9_]+)['\"]\]", target)]
        block = _group_comment_above(module.lines, lineno, keys)
    if block:
        return " ".join(block)
    function = _enclosing_function(module, node)
    if function is not None:
        found = _docstring_paragraph(ast.get_docstring(function), name)
        if found:
            return found
    return _docstring_paragraph(ast.get_docstring(module.tree), name)


def _wrappers(module: SourceModule) -> dict[str, tuple[int, str, int | None]]:
    """Functions of the module that read the variable their argument names: ``name -> (index of
    the name parameter, the env helper, index of the default parameter or None)``."""
    found: dict[str, tuple[int, str, int | None]] = {}
    for function in module.tree.body:
        if not isinstance(function, ast.FunctionDef):
            continue
        params = [arg.arg for arg in function.args.args]
        for call in ast.walk(function):
            if not (isinstance(call, ast.Call) and call_name(call) in ENV_HELPERS and call.args):
                continue
            first = call.args[0]
            if isinstance(first, ast.Name) and first.id in params:
                default = call.args[1] if len(call.args) > 1 else None
                default_index = (
                    params.index(default.id)
                    if isinstance(default, ast.Name) and default.id in params
                    else None
                )
                found[function.name] = (params.index(first.id), call_name(call), default_index)
    return found


def _imported_function(module: SourceModule, name: str) -> tuple[Path, str] | None:
    for node in module.tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    path = ROOT / (node.module.replace(".", "/") + ".py")
                    return (path, alias.name) if path.exists() else None
    return None


def env_reads(
    module: SourceModule, *, follow_environ: bool = True, within: ast.AST | None = None
) -> list[EnvRead]:
    """Every environment variable ``module`` reads (in ``within`` only, when given)."""
    wrappers = _wrappers(module)
    reads: list[EnvRead] = []
    for call in ast.walk(within or module.tree):
        if not isinstance(call, ast.Call):
            continue
        name_of_call = call_name(call)
        name: str | None = None
        kind = "string"
        default = ""
        if name_of_call in ENV_HELPERS and call.args:
            name = const_str(call.args[0])
            kind, unset = ENV_HELPERS[name_of_call]
            given = call.args[1] if len(call.args) > 1 else None
            given = given or next((kw.value for kw in call.keywords if kw.arg == "default"), None)
            default = module.segment(given) if given is not None else (unset or "")
        elif name_of_call in wrappers and call.args:
            index, helper, default_index = wrappers[name_of_call]
            if index < len(call.args):
                name = const_str(call.args[index])
                kind = ENV_HELPERS[helper][0]
                if default_index is not None and default_index < len(call.args):
                    default = module.segment(call.args[default_index])
        elif name_of_call in {"os.environ.get", "os.getenv", "os.environ.setdefault"} and call.args:
            name = const_str(call.args[0])
            default = module.segment(call.args[1]) if len(call.args) > 1 else ""
        elif (
            follow_environ
            and any(_is_os_environ(arg) for arg in call.args)
            and isinstance(call.func, ast.Name)
        ):
            reads.extend(_followed(module, call))
            continue
        if name is None:
            continue
        _, target = _statement_of(module, call)
        reads.append(
            EnvRead(
                name=name,
                kind=kind,
                default=default,
                meaning=_meaning(module, call, name, target),
                target=target,
                where=f"{module.relative()}:{call.lineno}",
            )
        )
    for sub in ast.walk(within or module.tree):
        if isinstance(sub, ast.Subscript) and _is_os_environ(sub.value):
            name = const_str(sub.slice)
            if name and isinstance(sub.ctx, ast.Load):
                _, target = _statement_of(module, sub)
                reads.append(
                    EnvRead(
                        name,
                        "string",
                        "required",
                        _meaning(module, sub, name, target),
                        target,
                        f"{module.relative()}:{sub.lineno}",
                    )
                )
    return reads


def _followed(module: SourceModule, call: ast.Call) -> list[EnvRead]:
    """The reads inside an imported function the settings hand ``os.environ`` to."""
    assert isinstance(call.func, ast.Name)
    found = _imported_function(module, call.func.id)
    if found is None:
        return []
    path, function_name = found
    other = SourceModule.parse(path)
    function = next(
        (
            node
            for node in other.tree.body
            if isinstance(node, ast.FunctionDef) and node.name == function_name
        ),
        None,
    )
    if function is None:
        return []
    reads = env_reads(other, follow_environ=False, within=function)
    _, target = _statement_of(module, call)
    for read in reads:
        read.target = f"{function_name}()"
    return reads


def settings_modules() -> list[Path]:
    return [ROOT / "console" / "settings.py", *sorted((ROOT / "console").glob("settings_*.py"))]


def settings_reads() -> list[EnvRead]:
    reads: list[EnvRead] = []
    for path in settings_modules():
        if path.exists():
            reads.extend(env_reads(SourceModule.parse(path)))
    return reads


def other_reads(known: set[str]) -> list[EnvRead]:
    """Variables the rest of the product reads that the settings do not."""
    settings_paths = set(settings_modules())
    reads: list[EnvRead] = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in settings_paths or "migrations" in path.parts or path.name == "env.py":
                continue
            reads.extend(
                read
                for read in env_reads(SourceModule.parse(path), follow_environ=False)
                if read.name not in known
            )
    return reads


def _merge(reads: list[EnvRead]) -> dict[str, list[EnvRead]]:
    merged: dict[str, list[EnvRead]] = {}
    for read in reads:
        merged.setdefault(read.name, []).append(read)
    return merged


def render_settings() -> str:
    reads = settings_reads()
    merged = _merge(reads)
    out = [
        f"{len(merged)} variables, read by {', '.join(f'`{p.relative_to(ROOT).as_posix()}`' for p in settings_modules() if p.exists())}"
        " (and the functions they hand the environment to). An empty value counts as unset.",
        "",
        "| variable | type | default | sets | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in sorted(merged):
        first = merged[name][0]
        defaults = list(dict.fromkeys(read.default for read in merged[name] if read.default))
        targets = list(dict.fromkeys(read.target for read in merged[name] if read.target))
        meaning = next((read.meaning for read in merged[name] if read.meaning), "")
        out.append(
            f"| `{name}` | {first.kind} | {'<br>'.join(code_cell(d) for d in defaults) or 'unset'} | "
            f"{'<br>'.join(code_cell(t) for t in targets)} | {cell(rst_to_md(meaning))} |"
        )
    others = _merge(other_reads(set(merged)))
    out += [
        "",
        "## Read outside the settings",
        "",
        "Variables other parts of the product read themselves (the same scan over "
        + ", ".join(f"`{p}/`" for p in PRODUCT_PACKAGES)
        + ").",
        "",
        "| variable | default | read in | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name in sorted(others):
        items = others[name]
        defaults = list(dict.fromkeys(read.default for read in items if read.default))
        where = "<br>".join(f"`{read.where}`" for read in items)
        meaning = next((read.meaning for read in items if read.meaning), "")
        out.append(
            f"| `{name}` | {'<br>'.join(code_cell(d) for d in defaults) or 'unset'} | {where} | "
            f"{cell(rst_to_md(meaning))} |"
        )
    return "\n".join(out) + "\n"
