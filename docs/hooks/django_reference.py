"""The reference pages that need Django: the ``manage.py`` commands with their ``--help``, the
OpenAPI document with the problem types, and the Prometheus metrics.

``dump()`` sets Django up and collects them; it runs only in a child process (``python
docs/hooks/generated.py --dump``, started by ``collected()``), so the build process never imports
the project. The renderers (``render_commands``, ``render_api``, ``render_metrics``) turn the
collected data into Markdown in the build process, with what can be read with ``ast`` alone (the
gauges computed at scrape time, the ``problem(...)`` calls). Part of the hook ``generated.py``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from source_scan import PRODUCT_PACKAGES, ROOT, SourceModule, call_name, cell, const_str, rst_to_md

#: The hook, run as a script in the child process (``--dump``).
HOOK = Path(__file__).with_name("generated.py")
#: The DATABASE_URL of the child process: nothing connects to it (without one the settings would
#: start the embedded PostgreSQL).
_DUMMY_DATABASE_URL = "postgres://docs:docs@127.0.0.1:9/docs-build-placeholder"


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


def dump() -> dict[str, Any]:
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


def collected() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(HOOK), "--dump"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
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
    """The gauges computed at scrape time: every ``GaugeMetricFamily("name", "help", labels=...)``
    call in the product (``operations/metrics.py``'s collector, and those ``/metrics`` appends in
    the console, such as the provider findings), read with ``ast``."""
    gauges = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "GaugeMetricFamily" not in path.read_text(encoding="utf-8"):
                continue
            module = SourceModule.parse(path)
            for call in ast.walk(module.tree):
                if not (isinstance(call, ast.Call) and call_name(call) == "GaugeMetricFamily"):
                    continue
                name = const_str(call.args[0]) if call.args else None
                if name is None or len(call.args) < 2:
                    continue
                help_text = call.args[1]
                labels = next((kw.value for kw in call.keywords if kw.arg == "labels"), None)
                gauges.append(
                    {
                        "name": name,
                        "type": "gauge",
                        "help": ast.literal_eval(help_text)
                        if isinstance(help_text, ast.Constant)
                        else module.segment(help_text),
                        "labels": ast.literal_eval(labels) if labels is not None else [],
                        "when": f"read from PostgreSQL at each scrape (`{path.relative_to(ROOT).as_posix()}`)",
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
            f"| `{metric['name']}` | {metric['type']} | {labels} | {cell(metric['help'])} | {metric['when']} |"
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
                out += [rst_to_md(operation["description"].strip()), ""]
            parameters = operation.get("parameters", [])
            if parameters:
                out += [
                    "| parameter | in | required | type | description |",
                    "| --- | --- | --- | --- | --- |",
                ]
                for parameter in parameters:
                    out.append(
                        f"| `{parameter['name']}` | {parameter['in']} | {'yes' if parameter.get('required') else 'no'} | "
                        f"{cell(_ref_name(parameter.get('schema')))} | {cell(parameter.get('description', ''))} |"
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
                        f"{cell(_ref_name(content.get('schema')))} | {cell(response.get('description', ''))} |"
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
            f"| `{code}` | {problem['status']} | {cell(problem['title'])} | {cell(rst_to_md(problem['detail']))} |"
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
                if not (isinstance(call, ast.Call) and call_name(call).split(".")[-1] == "problem"):
                    continue
                args = list(call.args) + [kw.value for kw in call.keywords if kw.arg in {"code"}]
                if len(args) < 4:
                    continue
                status, title, code = args[0], args[1], args[3]
                if isinstance(status, ast.Constant) and const_str(code):
                    found.setdefault(
                        str(const_str(code)),
                        {
                            "status": status.value,
                            "title": const_str(title) or ast.unparse(title),
                            "detail": f"`{path.relative_to(ROOT).as_posix()}`",
                        },
                    )
    return found
