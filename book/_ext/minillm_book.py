"""Sphinx fixes for the course website, loaded by book/_config.yml (`local_extensions`).

Inline scripts that extensions add while the build runs (sphinx-thebe's configuration,
sphinx-togglebutton's selector) reach Sphinx 7 twice, once with filename None and once
with '', so Sphinx does not see them as equal. Every page then declared
`const THEBE_JS_URL` twice and the browser stopped the second script with "Identifier
'THEBE_JS_URL' has already been declared". We keep the first copy of each.
"""

from __future__ import annotations


def drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    """Keep one copy of each script: same file (or inline body) and attributes."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        key = (script.filename or "", tuple(sorted(script.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", drop_duplicate_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
