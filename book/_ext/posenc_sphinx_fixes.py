"""Sphinx fixes for the HTML book (registered as a local extension in _config.yml).

Inline scripts added with ``app.add_js_file(None, body=...)`` (sphinx-thebe's ``const THEBE_JS_URL``,
sphinx-togglebutton's selector) appear twice on every page under Sphinx 7.4: ``prepare_writing`` re-adds the
registry's copy as ``filename=''`` beside the builder's ``filename=None`` one, and the second ``const``
declaration throws "Identifier 'THEBE_JS_URL' has already been declared" in the reader's browser.
"""
from __future__ import annotations


def _script_key(script) -> tuple:
    attributes = tuple(sorted((key, str(value)) for key, value in getattr(script, "attributes", {}).items()))
    return (getattr(script, "filename", script) or "", attributes)


def drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
