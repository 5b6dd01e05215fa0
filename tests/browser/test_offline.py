"""The built book loads nothing from the network: the static audit of book/tools/make_offline.py."""

from __future__ import annotations

import pytest
from browser_support import HTML_DIR

from book.tools import make_offline

pytestmark = pytest.mark.browser


def test_built_book_is_offline_complete(site):
    assert make_offline.configured_mathjax_path() == make_offline.MATHJAX_PATH
    assert make_offline.MATHJAX_EXTENSION in make_offline.configured_extensions()
    assert make_offline.check_mathjax_bundle(site) == []  # MathJax 3.2.2 and its fonts, from sphinx-mathjax-offline
    assert make_offline.audit(site) == []
    assert make_offline.check_mathjax_pages(site) == []
    assert site == HTML_DIR


def test_audit_flags_remote_and_missing_resources(tmp_path):
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "here.css").write_text(
        "@import 'https://fonts.example.org/x.css'; .a { background: url(here.png) } "
        ".b { src: url('https://cdn.example.org/f.woff2') }"
    )
    (tmp_path / "_static" / "here.png").write_bytes(b"png")
    (tmp_path / "page.html").write_text("""<html><head>
<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>
<script src="_static/local.js"></script>
<link rel="stylesheet" href="_static/here.css">
<link rel="preload" as="font" href="//fonts.gstatic.com/f.woff2">
<link rel="canonical" href="https://example.org/page.html">
<style>.c { background: url(http://example.org/bg.png) }</style>
</head><body>
<a href="https://colab.research.google.com/github/o/r/blob/main/notebooks/x.ipynb">Colab</a>
<img src="data:image/png;base64,AAAA" alt="inline"><img srcset="_static/here.png 1x, https://x.org/2.png 2x">
<div class="math">\\(x\\)</div>
</body></html>""")
    found = sorted(make_offline.audit(tmp_path))
    assert found == sorted(
        [
            "_static/here.css: https://fonts.example.org/x.css (remote)",
            "_static/here.css: https://cdn.example.org/f.woff2 (remote)",
            "page.html: https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js (remote)",
            "page.html: _static/local.js (missing file)",
            "page.html: //fonts.gstatic.com/f.woff2 (remote)",
            "page.html: http://example.org/bg.png (remote)",
            "page.html: https://x.org/2.png (remote)",
        ]
    )
    assert make_offline.check_mathjax_pages(tmp_path) == [
        "page.html: has math but does not load _static/mathjax/tex-chtml.js"
    ]
    assert "is missing" in make_offline.check_mathjax_bundle(tmp_path)[0]
