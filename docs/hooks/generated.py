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

This file holds the MkDocs events, the marker dispatch and the ``--dump`` entry; the sections are
written by its sibling modules: ``settings_reference.py`` (the settings tables),
``django_reference.py`` (commands, API, metrics, and the child process) and ``source_scan.py``
(what both share). They are imported by plain name: MkDocs puts this file's directory on
``sys.path`` while it executes the hook, and Python does when the file runs as a script. So they
are imported at the top of this file, never inside an event (by then MkDocs has restored
``sys.path``).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from django_reference import collected, dump, render_api, render_commands, render_metrics
from settings_reference import render_settings

MARKER = re.compile(r"^<!--\s*generated:\s*([a-z-]+)\s*-->\s*$", re.MULTILINE)
OPENAPI_FILE = "reference/openapi.json"


# --- MkDocs events -----------------------------------------------------------------------------

_cache: dict[str, Any] = {}


def _data() -> dict[str, Any]:
    if "data" not in _cache:
        _cache["data"] = collected()
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
        json.dump(dump(), sys.stdout)
    else:
        section = sys.argv[1] if len(sys.argv) > 1 else "settings"
        print(RENDERERS[section]())
