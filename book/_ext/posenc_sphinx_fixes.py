"""Sphinx fixes for the HTML book (registered as a local extension in _config.yml).

1. Inline scripts added with ``app.add_js_file(None, body=...)`` (sphinx-thebe's ``const THEBE_JS_URL``,
   sphinx-togglebutton's selector) appear twice on every page under Sphinx 7.4: ``prepare_writing`` re-adds the
   registry's copy as ``filename=''`` beside the builder's ``filename=None`` one, and the second ``const``
   declaration throws "Identifier 'THEBE_JS_URL' has already been declared" in the reader's browser.
2. The theme loads Font Awesome's whole icon set as JavaScript (``scripts/fontawesome.js``, 1.5 MB on every
   page; its ``<script>`` is hard-coded in the theme's webpack-macros.html) to draw about twenty icons. When
   the build finishes, ``_static/posenc-icons.js`` is written (the SVG paths of just the icons the pages name,
   taken from that same file, and a few lines that swap each ``<i class="fa-...">`` for an inline ``<svg>``, as
   Font Awesome does) and every page's ``<script>`` is pointed at it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

FONTAWESOME = "scripts/fontawesome.js"
ICONS = "posenc-icons.js"
FONTAWESOME_SRC = re.compile(r"_static/scripts/fontawesome\.js(\?digest=[0-9a-f]+)?")
# an icon of Font Awesome's packs:  name:[width,height,[aliases],"unicode","svg path"]
ICON_ENTRY = re.compile(r'(?:"([a-z0-9-]+)"|\b([a-z0-9_]+)):\[(\d+),(\d+),\[([^\]]*)\],"[0-9a-f]*","([^"]+)"\]')
PACK = re.compile(r'\bd\("(fab|far|fas)",[A-Za-z_$]+\)')
ICON_CLASS = re.compile(r"\bfa-([a-z0-9-]+)")
STYLE_PREFIX = {
    "fa-brands": "fab",
    "fab": "fab",
    "fa-regular": "far",
    "far": "far",
    "fa-solid": "fas",
    "fas": "fas",
    "fa": "fas",
}


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


def icon_table(fontawesome_js: str) -> dict:
    """prefix -> {name or alias -> [width, height, path]} from Font Awesome's JavaScript."""
    packs = [(m.start(), m.group(1)) for m in PACK.finditer(fontawesome_js)]
    table: dict = {"fab": {}, "far": {}, "fas": {}}
    for match in ICON_ENTRY.finditer(fontawesome_js):
        prefix = next((p for start, p in packs if start > match.start()), None)
        if prefix is None:
            continue
        name = match.group(1) or match.group(2)
        icon = [int(match.group(3)), int(match.group(4)), match.group(6)]
        table[prefix].setdefault(name, icon)
        for alias in re.findall(r'"([a-z0-9-]+)"', match.group(5)):
            table[prefix].setdefault(alias, icon)
    return table


def used_icons(outdir: Path, table: dict) -> dict:
    """The icons named in the built pages and the theme's scripts: prefix -> {name: icon}."""
    names = set()
    for path in list(outdir.rglob("*.html")) + [
        p
        for p in (outdir / "_static").rglob("*.js")
        if not p.name.startswith(("fontawesome", "mathjax")) and "mathjax" not in p.parts
    ]:
        names.update(ICON_CLASS.findall(path.read_text(encoding="utf-8", errors="ignore")))
    return {prefix: {name: icons[name] for name in sorted(names) if name in icons} for prefix, icons in table.items()}


ICONS_JS = """/* The few Font Awesome icons the book uses, as inline SVG (posenc_sphinx_fixes.py). */
(function () {
  var icons = %s;
  var styles = %s;
  function prefixOf(el) {
    for (var i = 0; i < el.classList.length; i++) {
      var p = styles[el.classList[i]];
      if (p) return p;
    }
    return "fas";
  }
  function swap(el) {
    if (el.tagName === "svg" || el.getAttribute("data-posenc-icon")) return;
    var prefix = prefixOf(el), name = null, icon = null;
    for (var i = 0; i < el.classList.length && !icon; i++) {
      var c = el.classList[i];
      if (c.indexOf("fa-") !== 0 || styles[c]) continue;
      name = c.slice(3);
      icon = (icons[prefix] || {})[name] || icons.fas[name] || icons.fab[name] || icons.far[name];
    }
    if (!icon) return;
    var svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 " + icon[0] + " " + icon[1]);
    svg.setAttribute("class", "svg-inline--fa " + el.getAttribute("class"));
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    svg.setAttribute("data-icon", name);
    svg.setAttribute("data-prefix", prefix);
    var path = document.createElementNS("http://www.w3.org/2000/svg", "path");
    path.setAttribute("fill", "currentColor");
    path.setAttribute("d", icon[2]);
    svg.appendChild(path);
    el.setAttribute("data-posenc-icon", "1");
    el.style.display = "none";
    el.parentNode.insertBefore(svg, el);
  }
  function run(root) {
    var found = (root || document).querySelectorAll("i[class*='fa-'], span[class*='fa-']");
    for (var i = 0; i < found.length; i++) swap(found[i]);
  }
  var css = document.createElement("style");
  css.textContent = ".svg-inline--fa{display:inline-block;height:1em;overflow:visible;vertical-align:-0.125em;"
    + "box-sizing:content-box}.svg-inline--fa.fa-lg{height:1.25em;vertical-align:-0.2em}"
    + ".svg-inline--fa.fa-fw{width:1.25em}";
  document.head.appendChild(css);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", function () { run(); });
  else run();
  new MutationObserver(function (changes) {
    changes.forEach(function (c) {
      c.addedNodes.forEach(function (n) {
        if (n.nodeType !== 1) return;
        if (n.matches && n.matches("i[class*='fa-'], span[class*='fa-']")) swap(n);
        run(n);
      });
    });
  }).observe(document.documentElement, {childList: true, subtree: true});
})();
"""


def write_icons(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    source = outdir / "_static" / FONTAWESOME
    if not source.exists():
        return
    icons = used_icons(outdir, icon_table(source.read_text(encoding="utf-8")))
    styles = {name: prefix for name, prefix in STYLE_PREFIX.items() if name != "fa"}
    (outdir / "_static" / ICONS).write_text(
        ICONS_JS % (json.dumps(icons, separators=(",", ":")), json.dumps(styles)), encoding="utf-8"
    )
    for page in outdir.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        swapped = FONTAWESOME_SRC.sub("_static/" + ICONS, text)
        if swapped != text:
            page.write_text(swapped, encoding="utf-8")


def setup(app):
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    app.connect("build-finished", write_icons)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
