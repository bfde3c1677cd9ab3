"""One self-contained HTML page from a *view model*: a plain JSON-able dict of
charts and tables, drawn in the browser by ``_web/view.js`` as inline SVG.

The scheduler's live dashboard, its ``report --html`` and ``python -m apgas
timeline --html`` all build a view model and hand it here, so one renderer
draws all three. The page fetches nothing: the script, the style and the data
are inline, and its Content-Security-Policy forbids loading anything else
(a live page may only connect back to the server that served it).

The view model::

    {"title": str, "subtitle": str, "t0": float, "t1": float,   # seconds
     "live": {"stream": "/stream"} | absent,                     # server-sent updates
     "sections": [
       {"kind": "gantt", "id": str, "title": str, "rows": [label, ...],
        "bars": [[row, t_from, t_to, key, text], ...],
        "marks": [{"t": s, "kind": "grow"|"shrink"|..., "key": str, "label": str,
                   "rows": [row, ...] (optional: default all rows)}],
        "legend": {key: label}},
       {"kind": "series", "id": str, "title": str, "unit": str, "step": bool,
        "series": [{"name": str, "key": str, "points": [[t, value], ...]}],
        "marks": [...as above]},
       {"kind": "table", "id": str, "title": str, "columns": [str, ...], "rows": [[cell, ...]]},
       {"kind": "metrics", "id": str, "title": str, "items": [[name, value], ...]}]}

A ``key`` picks a colour (the same key, the same colour in every section);
every bar and mark carries it as ``data-key``, and marks have the classes
``mark`` and their kind, so that tests (and users' scripts) can find them.
"""

from __future__ import annotations

import json
from functools import cache
from html import escape
from importlib import resources
from typing import Any

__all__ = ["render_page", "model_json", "CONTENT_SECURITY_POLICY"]

CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; "
                           "style-src 'unsafe-inline'; img-src data:; connect-src 'self'")


@cache
def _asset(name: str) -> str:
    return resources.files("apgas.serving").joinpath("_web", name).read_text(encoding="utf-8")


def model_json(model: dict[str, Any]) -> str:
    """The model as JSON that is safe inside a ``<script>`` element: no ``<``,
    ``>`` or ``&`` appear, so a job named ``</script>`` stays text."""
    text = json.dumps(model, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(model: dict[str, Any]) -> str:
    """The whole page: open it from a file, or serve it (then ``model["live"]``
    names the event stream that brings new models)."""
    title = escape(str(model.get("title", "")))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CONTENT_SECURITY_POLICY}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{title}</title>\n<style>\n{_asset('view.css')}</style>\n</head>\n<body>\n"
        f"<main id=\"app\"><h1>{title}</h1><noscript>This page draws its charts with "
        "JavaScript.</noscript></main>\n"
        f"<script type=\"application/json\" id=\"model\">{model_json(model)}</script>\n"
        f"<script>\n{_asset('view.js')}</script>\n</body></html>\n")
