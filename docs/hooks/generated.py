"""MkDocs hook: the reference pages written from the code at build time, so they cannot drift.

A page asks for a section with a marker comment on a line of its own:

- ``<!-- generated: settings -->``: every environment variable the settings read. Parsed with
  ``ast`` (nothing imported) from ``console/settings.py`` and any ``console/settings_*.py``:
  each ``env_*("NAME", default)`` call (``console/env.py``), each ``os.environ.get("NAME")`` /
  ``os.environ["NAME"]`` / ``os.getenv("NAME")``, each call of a local wrapper that passes its
  argument to an ``env_*`` helper (``_rate``), and the ``env_*`` calls inside a function the
  settings hand ``os.environ`` to (``security_settings``). The default is the source text; the
  meaning is the comment block directly above the read's own line when the read starts a line
  inside its statement (a keyword or other argument), else directly above the statement or
  dictionary entry (else the nearest group comment above it that names the variable or the
  entry's key, else the paragraph of the function's or module's docstring that names it). A
  second table lists the variables the rest of the product reads (the same scan over
  ``console``, ``operations`` and ``reconciliation``).
- ``<!-- generated: commands -->``: every ``manage.py`` command of our apps (each
  ``*/management/commands/*.py``) with its ``--help``, as Django formats it.
- ``<!-- generated: api -->``: the OpenAPI document drf-spectacular serves at ``/api/schema/``,
  rendered per operation, with the problem types; the whole document is also written to the site
  as ``reference/openapi.json``.
- ``<!-- generated: metrics -->``: the Prometheus metrics of ``operations/metrics.py``: the
  registered collectors' objects, and the gauges computed at scrape time (``GaugeMetricFamily``
  calls, parsed with ``ast``).

The parts that need Django (commands, the OpenAPI document, metrics, problem types) are
produced by this file run as a script in a child process (``python docs/hooks/generated.py
--dump``): Django is set up there with a placeholder ``DATABASE_URL`` (nothing connects to it;
without one the settings would start the embedded PostgreSQL), a temporary data directory and
the sandbox provider on, as quick start serves it. The build process itself never imports the
project.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*generated:\s*([a-z-]+)\s*-->\s*$", re.MULTILINE)
OPENAPI_FILE = "reference/openapi.json"

#: The helpers of console/env.py that read one variable, and what each gives when unset.
ENV_HELPERS = {
    "env_str": ("string", '""'),
    "env_int": ("integer", None),
    "env_float": ("number", None),
    "env_bool": ("boolean", None),
    "env_list": ("comma-separated list", None),
    "env_json_file": ("path of a JSON file", "unset: {}"),
}
#: The product's packages, scanned for variables read outside the settings.
PRODUCT_PACKAGES = ("console", "operations", "reconciliation")
#: Test-only switches the rest of the product reads: not configuration of a deployment.
_DUMMY_DATABASE_URL = "postgres://docs:docs@127.0.0.1:9/docs-build-placeholder"


# --- settings (ast only) -----------------------------------------------------------------------


@dataclass
class EnvRead:
    """One place the code reads an environment variable."""

    name: str
    kind: str
    default: str
    meaning: str
    target: str
    where: str


@dataclass
class _Module:
    path: Path
    tree: ast.Module
    lines: list[str]
    parents: dict[int, ast.AST] = field(default_factory=dict)

    @classmethod
    def parse(cls, path: Path) -> _Module:
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


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return ast.unparse(func)
    return ""


def _is_os_environ(node: ast.AST) -> bool:
    return ast.unparse(node) in {"os.environ", "environ"}


def _const_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


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


def _statement_of(module: _Module, node: ast.AST) -> tuple[ast.AST, str]:
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


def _enclosing_function(module: _Module, node: ast.AST) -> ast.FunctionDef | None:
    parent = module.parent(node)
    while parent is not None:
        if isinstance(parent, ast.FunctionDef):
            return parent
        parent = module.parent(parent)
    return None


def _meaning(module: _Module, node: ast.AST, name: str, target: str) -> str:
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


def _wrappers(module: _Module) -> dict[str, tuple[int, str, int | None]]:
    """Functions of the module that read the variable their argument names: ``name -> (index of
    the name parameter, the env helper, index of the default parameter or None)``."""
    found: dict[str, tuple[int, str, int | None]] = {}
    for function in module.tree.body:
        if not isinstance(function, ast.FunctionDef):
            continue
        params = [arg.arg for arg in function.args.args]
        for call in ast.walk(function):
            if not (isinstance(call, ast.Call) and _call_name(call) in ENV_HELPERS and call.args):
                continue
            first = call.args[0]
            if isinstance(first, ast.Name) and first.id in params:
                default = call.args[1] if len(call.args) > 1 else None
                default_index = (
                    params.index(default.id)
                    if isinstance(default, ast.Name) and default.id in params
                    else None
                )
                found[function.name] = (params.index(first.id), _call_name(call), default_index)
    return found


def _imported_function(module: _Module, name: str) -> tuple[Path, str] | None:
    for node in module.tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    path = ROOT / (node.module.replace(".", "/") + ".py")
                    return (path, alias.name) if path.exists() else None
    return None


def env_reads(
    module: _Module, *, follow_environ: bool = True, within: ast.AST | None = None
) -> list[EnvRead]:
    """Every environment variable ``module`` reads (in ``within`` only, when given)."""
    wrappers = _wrappers(module)
    reads: list[EnvRead] = []
    for call in ast.walk(within or module.tree):
        if not isinstance(call, ast.Call):
            continue
        name_of_call = _call_name(call)
        name: str | None = None
        kind = "string"
        default = ""
        if name_of_call in ENV_HELPERS and call.args:
            name = _const_str(call.args[0])
            kind, unset = ENV_HELPERS[name_of_call]
            given = call.args[1] if len(call.args) > 1 else None
            given = given or next((kw.value for kw in call.keywords if kw.arg == "default"), None)
            default = module.segment(given) if given is not None else (unset or "")
        elif name_of_call in wrappers and call.args:
            index, helper, default_index = wrappers[name_of_call]
            if index < len(call.args):
                name = _const_str(call.args[index])
                kind = ENV_HELPERS[helper][0]
                if default_index is not None and default_index < len(call.args):
                    default = module.segment(call.args[default_index])
        elif name_of_call in {"os.environ.get", "os.getenv", "os.environ.setdefault"} and call.args:
            name = _const_str(call.args[0])
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
            name = _const_str(sub.slice)
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


def _followed(module: _Module, call: ast.Call) -> list[EnvRead]:
    """The reads inside an imported function the settings hand ``os.environ`` to."""
    assert isinstance(call.func, ast.Name)
    found = _imported_function(module, call.func.id)
    if found is None:
        return []
    path, function_name = found
    other = _Module.parse(path)
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
            reads.extend(env_reads(_Module.parse(path)))
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
                for read in env_reads(_Module.parse(path), follow_environ=False)
                if read.name not in known
            )
    return reads


def _merge(reads: list[EnvRead]) -> dict[str, list[EnvRead]]:
    merged: dict[str, list[EnvRead]] = {}
    for read in reads:
        merged.setdefault(read.name, []).append(read)
    return merged


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    if not text:
        return ""
    ticks = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return _cell(f"{ticks}{pad}{text}{pad}{ticks}")


def _rst_to_md(text: str) -> str:
    return re.sub(r"``([^`]+)``", r"`\1`", text)


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
            f"| `{name}` | {first.kind} | {'<br>'.join(_code(d) for d in defaults) or 'unset'} | "
            f"{'<br>'.join(_code(t) for t in targets)} | {_cell(_rst_to_md(meaning))} |"
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
            f"| `{name}` | {'<br>'.join(_code(d) for d in defaults) or 'unset'} | {where} | "
            f"{_cell(_rst_to_md(meaning))} |"
        )
    return "\n".join(out) + "\n"


# --- the parts that need Django (run in a child process) --------------------------------------


def command_modules() -> list[tuple[str, str]]:
    """``(app module, command)`` for every command file of our apps."""
    found: list[tuple[str, str]] = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("management/commands/*.py")):
            if path.name.startswith("_"):
                continue
            app = path.parent.parent.parent.relative_to(ROOT).as_posix().replace("/", ".")
            found.append((app, path.stem))
    return found


def _dump() -> dict[str, Any]:
    """Set Django up in this (child) process and collect what the pages need."""
    scratch = tempfile.mkdtemp(prefix="el-docs-")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ["DATABASE_URL"] = _DUMMY_DATABASE_URL
    os.environ["EFFECT_LEDGER_DATA_DIR"] = scratch
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = scratch
    os.environ["EFFECT_LEDGER_SANDBOX"] = "1"
    os.environ["COLUMNS"] = "100"
    os.environ.pop("CELERY_BROKER_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import load_command_class

    commands = []
    for app, name in command_modules():
        command = load_command_class(app, name)
        help_text = command.create_parser("manage.py", name).format_help()
        commands.append(
            {"app": app, "name": name, "help": help_text.replace(scratch, "$EFFECT_LEDGER_DATA_DIR")}
        )

    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    schema_json = json.loads(json.dumps(schema, default=str))

    from prometheus_client.metrics import MetricWrapperBase

    import operations.metrics as metrics_module

    metrics = []
    for value in vars(metrics_module).values():
        if isinstance(value, MetricWrapperBase):
            kind = value._type
            name = value._name + ("_total" if kind == "counter" else "")
            metrics.append(
                {
                    "name": name,
                    "type": kind,
                    "help": value._documentation,
                    "labels": list(value._labelnames),
                    "when": "counted by the processes that do the work",
                }
            )

    from operations.exceptions import LedgerError

    problems: dict[str, dict[str, Any]] = {}
    pending: list[type[LedgerError]] = [LedgerError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is LedgerError:
            continue
        problems.setdefault(
            cls.code,
            {"status": cls.status, "title": cls.title, "detail": " ".join((cls.__doc__ or "").split())},
        )
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    return {"commands": commands, "openapi": schema_json, "metrics": metrics, "problems": problems}


def _collected() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, __file__, "--dump"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        raise RuntimeError(f"docs/hooks/generated.py --dump failed:\n{result.stderr[-4000:]}")
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# --- commands, metrics, API pages --------------------------------------------------------------


def render_commands(data: dict[str, Any]) -> str:
    out = [
        f"{len(data['commands'])} commands. Each section is the command's `python manage.py NAME --help`,"
        " as Django prints it.",
        "",
    ]
    for command in sorted(data["commands"], key=lambda c: c["name"]):
        out += [
            f"## `{command['name']}`",
            "",
            f"From `{command['app']}` (`{command['app'].replace('.', '/')}/management/commands/{command['name']}.py`).",
            "",
            "```text",
            command["help"].rstrip(),
            "```",
            "",
        ]
    return "\n".join(out)


def scrape_gauges() -> list[dict[str, Any]]:
    """The gauges ``operations/metrics.py`` computes at scrape time (``GaugeMetricFamily`` calls)."""
    module = _Module.parse(ROOT / "operations" / "metrics.py")
    gauges = []
    for call in ast.walk(module.tree):
        if isinstance(call, ast.Call) and _call_name(call) == "GaugeMetricFamily" and len(call.args) >= 2:
            name, help_text = _const_str(call.args[0]), call.args[1]
            labels = next((kw.value for kw in call.keywords if kw.arg == "labels"), None)
            if name is None:
                continue
            gauges.append(
                {
                    "name": name,
                    "type": "gauge",
                    "help": ast.literal_eval(help_text)
                    if isinstance(help_text, ast.Constant)
                    else module.segment(help_text),
                    "labels": ast.literal_eval(labels) if labels is not None else [],
                    "when": "read from PostgreSQL at each scrape",
                }
            )
    return gauges


def render_metrics(data: dict[str, Any]) -> str:
    rows = [*data["metrics"], *scrape_gauges()]
    out = [
        f"{len(rows)} metrics.",
        "",
        "| metric | type | labels | help | source |",
        "| --- | --- | --- | --- | --- |",
    ]
    for metric in sorted(rows, key=lambda m: m["name"]):
        labels = ", ".join(f"`{label}`" for label in metric["labels"])
        out.append(
            f"| `{metric['name']}` | {metric['type']} | {labels} | {_cell(metric['help'])} | {metric['when']} |"
        )
    return "\n".join(out) + "\n"


def _ref_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    for combinator in ("oneOf", "anyOf", "allOf"):
        if combinator in schema:
            return (
                f" {combinator.replace('Of', ' of')} ".join(
                    filter(None, (_ref_name(item) for item in schema[combinator]))
                )
                or combinator
            )
    if schema.get("type") == "array":
        return f"array of {_ref_name(schema.get('items')) or 'items'}"
    kind = schema.get("type", "")
    return f"{kind}" + (f" ({schema['format']})" if "format" in schema else "")


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def render_api(data: dict[str, Any]) -> str:
    document = data["openapi"]
    info = document.get("info", {})
    out = [
        f"**{info.get('title', '')}**, version {info.get('version', '')}, OpenAPI {document.get('openapi', '')}."
        f" {info.get('description', '')}",
        "",
        "The whole document: [openapi.json](openapi.json) (what `/api/schema/` serves, with the sandbox"
        " provider's actions, as quick start runs).",
        "",
    ]
    security = document.get("components", {}).get("securitySchemes", {})
    if security:
        out += ["## Authentication", ""]
        for name, scheme in security.items():
            detail = ", ".join(f"{key} `{value}`" for key, value in scheme.items() if key != "description")
            out.append(f"- `{name}`: {detail}. {scheme.get('description', '')}")
        out.append("")
    out += ["## Operations", ""]
    for path, methods in document.get("paths", {}).items():
        for method, operation in methods.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            out += [f"### `{method.upper()} {path}`", ""]
            if operation.get("summary"):
                out += [f"**{operation['summary']}**", ""]
            if operation.get("description"):
                out += [_rst_to_md(operation["description"].strip()), ""]
            parameters = operation.get("parameters", [])
            if parameters:
                out += [
                    "| parameter | in | required | type | description |",
                    "| --- | --- | --- | --- | --- |",
                ]
                for parameter in parameters:
                    out.append(
                        f"| `{parameter['name']}` | {parameter['in']} | {'yes' if parameter.get('required') else 'no'} | "
                        f"{_cell(_ref_name(parameter.get('schema')))} | {_cell(parameter.get('description', ''))} |"
                    )
                out.append("")
            body = operation.get("requestBody")
            if body:
                kinds = "; ".join(
                    f"`{content_type}`: {_ref_name(content.get('schema'))}"
                    for content_type, content in body.get("content", {}).items()
                )
                out += [f"Request body{' (required)' if body.get('required') else ''}: {kinds}", ""]
            out += ["| status | content | schema | description |", "| --- | --- | --- | --- |"]
            for status, response in operation.get("responses", {}).items():
                contents = response.get("content") or {"": {}}
                for content_type, content in contents.items():
                    out.append(
                        f"| {status} | {f'`{content_type}`' if content_type else ''} | "
                        f"{_cell(_ref_name(content.get('schema')))} | {_cell(response.get('description', ''))} |"
                    )
            out.append("")
    out += [
        "## Problem types",
        "",
        "Every error is `application/problem+json` (RFC 9457) with `type` "
        "`tag:effect-ledger,2026:problems/<code>` and `code` repeating its last segment. The codes"
        " the ledger's own errors carry (`operations/exceptions.py`), and the ones the API builds"
        " directly (`problem(...)` calls):",
        "",
        "| code | status | title | when |",
        "| --- | --- | --- | --- |",
    ]
    problems = {**_problem_calls(), **data["problems"]}
    for code in sorted(problems):
        problem = problems[code]
        out.append(
            f"| `{code}` | {problem['status']} | {_cell(problem['title'])} | {_cell(_rst_to_md(problem['detail']))} |"
        )
    components = document.get("components", {}).get("schemas", {})
    out += [
        "",
        "## Schemas",
        "",
        "The components the operations name (their fields are in openapi.json):",
        "",
    ]
    for name, schema in sorted(components.items()):
        description = " ".join(str(schema.get("description", "")).split())
        out.append(f"- `{name}`{': ' + description if description else ''}")
    return "\n".join(out) + "\n"


def _problem_calls() -> dict[str, dict[str, Any]]:
    """``problem(status, title, detail, code)`` calls with constant arguments in the product."""
    found: dict[str, dict[str, Any]] = {}
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or "lab" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for call in ast.walk(tree):
                if not (isinstance(call, ast.Call) and _call_name(call).split(".")[-1] == "problem"):
                    continue
                args = list(call.args) + [kw.value for kw in call.keywords if kw.arg in {"code"}]
                if len(args) < 4:
                    continue
                status, title, code = args[0], args[1], args[3]
                if isinstance(status, ast.Constant) and _const_str(code):
                    found.setdefault(
                        str(_const_str(code)),
                        {
                            "status": status.value,
                            "title": _const_str(title) or ast.unparse(title),
                            "detail": f"`{path.relative_to(ROOT).as_posix()}`",
                        },
                    )
    return found


# --- MkDocs events -----------------------------------------------------------------------------

_cache: dict[str, Any] = {}


def _data() -> dict[str, Any]:
    if "data" not in _cache:
        _cache["data"] = _collected()
    data: dict[str, Any] = _cache["data"]
    return data


def on_pre_build(config: Any) -> None:
    _cache.clear()


def on_files(files: Any, config: Any) -> Any:
    """Add ``reference/openapi.json`` to the site (the document the API page links to)."""
    from mkdocs.structure.files import File

    document = json.dumps(_data()["openapi"], indent=2, sort_keys=False) + "\n"
    files.append(File.generated(config, OPENAPI_FILE, content=document))
    return files


RENDERERS = {
    "settings": lambda: render_settings(),
    "commands": lambda: render_commands(_data()),
    "api": lambda: render_api(_data()),
    "metrics": lambda: render_metrics(_data()),
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        kind = match.group(1)
        if kind not in RENDERERS:
            from mkdocs.exceptions import PluginError

            raise PluginError(
                f"{page.file.src_path}: unknown generated section {kind!r} (known: {sorted(RENDERERS)})"
            )
        return RENDERERS[kind]()

    return MARKER.sub(replace, markdown)


if __name__ == "__main__":
    if sys.argv[1:] == ["--dump"]:
        json.dump(_dump(), sys.stdout)
    else:
        section = sys.argv[1] if len(sys.argv) > 1 else "settings"
        print(RENDERERS[section]())
