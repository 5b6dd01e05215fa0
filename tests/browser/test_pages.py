"""Every page of _toc.yml, opened in Chromium the way a reader opens it, with no network beyond localhost.

Each page is loaded once per test class (desktop width) in a fresh browser context (a first visit: nothing
cached), MathJax is waited for, the page is scrolled to the bottom (lazy images load), screenshots are taken at
desktop and phone widths, and the checks below read that page; a failure names the page. What the reader-facing
checks measure (code share, image sharpness, page weight, smallest figure text) is written per page to
_build/page-facts.txt.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from browser_support import (
    CODE_SHARE_LIMIT,
    DESKTOP,
    HTML_DIR,
    MB,
    MIN_FIGURE_TEXT_PX,
    MIN_IMAGE_RATIO,
    PHONE,
    ROOT,
    SCREENSHOT_DIR,
    WEIGHT_LIMIT,
    BookPage,
    Traffic,
    book_pages,
    watch,
)

from book.tools import repository
from book.tools.book_files import setup_cell_source
from book.tools.build_html import PUBLISHED_REF_FILE

pytestmark = pytest.mark.browser
PAGES = book_pages()
IMAGE_PATH = re.compile(r"(^data:|\.(png|jpe?g|gif|svg|webp)$)", re.IGNORECASE)
RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\\[A-Za-z]{2,}")  # \( \) \[ \] $$ \command
WIDGET_REPR = re.compile(
    r"^\s*(VBox|HBox|Box|IntSlider|FloatSlider|SelectionSlider|Dropdown|Output|interactive)\(", re.MULTILINE
)


def published_ref() -> str | None:
    """The commit the built site pins its Colab copies to (book/tools/build_html.py records it), or None."""
    return (PUBLISHED_REF_FILE.read_text().strip() if PUBLISHED_REF_FILE.exists() else "") or None


# One round trip collects what the checks need from the DOM of the main article.
FACTS_JS = r"""
() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const math = Array.from(article.querySelectorAll('.math'));
  const clone = article.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, textarea, mjx-container, .highlight').forEach(e => e.remove());
  const text = clone.textContent;
  const outputs = Array.from(article.querySelectorAll('.cell_output')).map(o => o.textContent).join('\n');
  const caption = el => ((el.closest('figure') || {querySelector: () => null})
    .querySelector('figcaption') || {textContent: ''}).textContent.trim();
  return {
    mathCount: math.length,
    untypeset: math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 120)),
    mathErrors: Array.from(article.querySelectorAll('mjx-merror'))
      .map(e => e.getAttribute('data-mjx-error') || e.textContent),
    containers: article.querySelectorAll('mjx-container').length,
    text: text,
    outputs: outputs,
    widgetElements: Array.from(document.querySelectorAll(
      '.jupyter-widgets, .widget-area, .widget-subarea, .lm-Widget, .p-Widget, [class^="widget-"], '
      + '[class*=" widget-"], script[type^="application/vnd.jupyter.widget"]'))
      .map(e => e.tagName + '.' + e.className + ' ' + (e.type || '')),
    images: Array.from(article.querySelectorAll('img')).map(img => ({
      src: (img.getAttribute('src') || '').slice(0, 100), alt: (img.getAttribute('alt') || '').trim(),
      caption: caption(img),
      loaded: img.complete && img.naturalWidth > 0})),
    figures: Array.from(article.querySelectorAll('figure')).map(f => ({
      id: f.id || f.className, caption: caption(f.querySelector('figcaption') || f),
      alts: Array.from(f.querySelectorAll('img')).map(i => (i.getAttribute('alt') || '').trim())})),
    colab: Array.from(document.querySelectorAll('a[href*="colab.research.google.com"]')).map(a => a.href),
    prev: (document.querySelector('a.left-prev') || {}).href || null,
    next: (document.querySelector('a.right-next') || {}).href || null,
    sliders: article.querySelectorAll('figure.posenc-slider').length,
    title: document.title,
  };
}
"""

# Visible-code share as a reader sees it: characters of the code cells' inputs that are rendered (not folded,
# not removed) over those plus the article's text, outputs and all cell inputs left out. Markdown's own code
# blocks count as text. The notebook-side measure (BRIEF-WEB.md, code_share.py) counts markdown SOURCE instead
# (TeX, link targets, markup), so for a math-heavy chapter this share comes out a little higher than that one.
CODE_SHARE_JS = r"""
() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  const inputs = Array.from(article.querySelectorAll('.cell_input'));
  const visible = inputs.filter(e => e.checkVisibility()).map(e => e.textContent.trim().length)
    .reduce((a, b) => a + b, 0);
  const clone = article.cloneNode(true);
  clone.querySelectorAll('.cell_input, .cell_output, details.above-input > summary, script, style, .headerlink')
    .forEach(e => e.remove());
  const text = clone.textContent.replace(/\s+/g, ' ').trim().length;
  return {code: visible, text: text, cells: inputs.length,
          visibleCells: inputs.filter(e => e.checkVisibility()).length};
}
"""

# Per image of the article: natural / displayed width and, where posenc.lab.interactive recorded the figure's
# smallest font (points) and width (inches), that text's size in CSS px at the displayed width.
IMAGES_JS = r"""
() => Array.from((document.querySelector('article.bd-article') || document.body).querySelectorAll('img'))
  .filter(img => img.checkVisibility() && img.clientWidth > 0)
  .map(img => {
    const src = img.currentSrc || img.src;
    const pt = parseFloat(img.dataset.minFontPt), inches = parseFloat(img.dataset.figWidthIn);
    return {src: src.slice(0, 80), vector: /\.svg($|\?)|^data:image\/svg/.test(src),
            natural: img.naturalWidth, shown: img.clientWidth,
            textPx: (pt && inches) ? pt * img.clientWidth / (72 * inches) : null};
  })
"""

FINGERPRINT_JS = """
figure => {
  const s = figure.querySelector('img').src;
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
  return s.length + ':' + (h >>> 0);
}
"""


def screenshot_path(entry: str, width_name: str) -> Path:
    return SCREENSHOT_DIR / f"{entry.replace('/', '__')}-{width_name}.png"


def wait_for_math(page, has_math: bool) -> None:
    """Wait until MathJax has typeset the page (pages without math may not load MathJax at all)."""
    if not has_math:
        return
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=60_000)
    page.evaluate("() => MathJax.startup.promise.then(() => true)")


class Visit:
    """A page opened once: its Playwright page, traffic and DOM facts."""

    def __init__(self, browser, base_url: str, book_page):
        self.book_page = book_page
        self.url = urljoin(base_url, book_page.html)
        self.context = browser.new_context(viewport=DESKTOP, service_workers="block")
        self.page = self.context.new_page()
        self.traffic = Traffic()
        watch(self.context, self.page, self.traffic)
        self.response = self.page.goto(self.url, wait_until="load")
        if self.response is None or not self.response.ok:
            self.close()
            pytest.fail(
                f"{book_page.html} is not in the build (HTTP "
                f"{self.response.status if self.response else '-'}): run `make book`"
            )
        has_math = self.page.locator("article .math").count() > 0
        wait_for_math(self.page, has_math)
        self.page.wait_for_load_state("networkidle")
        self.page.evaluate("() => document.fonts.ready.then(() => true)")
        self.scroll_through()
        self.facts = self.page.evaluate(FACTS_JS)
        self.images = self.page.evaluate(IMAGES_JS)
        self.code_share = self.page.evaluate(CODE_SHARE_JS)
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=screenshot_path(book_page.entry, "desktop"), full_page=True)
        self.page.set_viewport_size(PHONE)
        self.page.wait_for_timeout(300)
        self.phone_images = self.page.evaluate(IMAGES_JS)
        self.page.screenshot(path=screenshot_path(book_page.entry, "phone"), full_page=True)
        self.page.set_viewport_size(DESKTOP)
        self.page.wait_for_timeout(200)

    def scroll_through(self):
        """Scroll to the bottom a screen at a time, as a reader does, so that lazy images load (and count)."""
        height = self.page.evaluate("() => document.documentElement.scrollHeight")
        for y in range(0, height + DESKTOP["height"], DESKTOP["height"]):
            self.page.evaluate(f"() => window.scrollTo(0, {y})")
            self.page.wait_for_timeout(30)
        self.page.wait_for_function("() => Array.from(document.images).every(i => i.complete)", timeout=60_000)
        self.page.evaluate("() => window.scrollTo(0, 0)")

    def close(self):
        self.context.close()


@pytest.fixture(scope="class")
def visit(book_page, browser, base_url):
    opened = Visit(browser, base_url, book_page)
    yield opened
    opened.close()


def test_every_toc_page_is_built(site):
    assert PAGES, "no page of _toc.yml has a source file"
    missing = [p.html for p in PAGES if not (site / p.html).exists()]
    assert not missing, f"pages of _toc.yml not in the build (run `make book`): {missing}"


@pytest.mark.parametrize("book_page", PAGES, ids=str, scope="class")
class TestPage:
    def test_loads_without_errors(self, visit):
        problems = visit.traffic.problems()
        assert not problems, f"{visit.book_page}:\n  " + "\n  ".join(problems)

    def test_every_equation_is_typeset(self, visit):
        facts = visit.facts
        assert not facts["untypeset"], f"math left untypeset: {facts['untypeset'][:5]}"
        assert not facts["mathErrors"], f"MathJax errors: {facts['mathErrors'][:5]}"
        assert facts["containers"] >= facts["mathCount"], "fewer MathJax containers than math elements"
        raw = [
            " ".join(facts["text"][max(0, m.start() - 40) : m.end() + 40].split())
            for m in RAW_TEX.finditer(facts["text"])
        ]
        assert not raw, f"raw TeX left in the page text: {raw[:5]}"
        if visit.book_page.is_notebook:
            assert facts["mathCount"] > 0, "a chapter with no equation: dollarmath not parsed?"

    def test_no_ipywidgets_view(self, visit):
        facts = visit.facts
        assert not facts["widgetElements"], f"ipywidgets views/state on the page: {facts['widgetElements'][:5]}"
        reprs = WIDGET_REPR.findall(facts["outputs"])
        assert not reprs, f"text repr of a widget in a cell output (a live widget was executed): {reprs[:5]}"
        assert "Loading widget" not in facts["outputs"]

    def test_every_image_is_described(self, visit):
        undescribed = [
            image["src"]
            for image in visit.facts["images"]
            if not image["caption"] and (not image["alt"] or IMAGE_PATH.search(image["alt"]))
        ]
        assert not undescribed, f"images with neither alt text nor a caption: {undescribed}"
        broken = [image["src"] for image in visit.facts["images"] if not image["loaded"]]
        assert not broken, f"images that did not load: {broken}"
        bare = [f["id"] for f in visit.facts["figures"] if not f["caption"] and not all(f["alts"] or [""])]
        assert not bare, f"figures with neither caption nor alt text: {bare}"

    def test_colab_link(self, visit):
        """Colab opens main's notebook from a local build, and from a published one (POSENC_PUBLISH_REF) the copy of
        the page's notebook whose setup cell installs posenc at the page's commit (book/tools/repository.py)."""
        links = set(visit.facts["colab"])
        if not visit.book_page.is_notebook:
            assert not links, f"a non-notebook page offers Colab: {links}"
            return
        ref = published_ref()
        expected = repository.colab_url(visit.book_page.entry, ref)
        assert links == {expected}, f"Colab links {links}, expected {expected}"
        assert visit.book_page.entry.startswith("notebooks/")
        notebook = ROOT / f"{visit.book_page.entry}.ipynb"
        assert notebook.exists(), f"the Colab link opens {notebook.relative_to(ROOT)}, which is not in the repository"
        if ref:
            pinned = repository.pinned_dir(ref) / f"{visit.book_page.entry}.ipynb"
            assert pinned.exists(), f"no pinned copy {pinned.relative_to(ROOT)} for the Pages workflow to publish"
            for copy in (pinned, HTML_DIR / "_sources" / f"{visit.book_page.entry}.ipynb"):
                cell = repository.first_code_cell(json.loads(copy.read_text()))
                assert "".join(cell["source"]) == setup_cell_source(ref=ref), f"{copy}: setup cell not pinned"

    def test_static_sliders_move(self, visit):
        """Every slider of every static figure moves by keys and mouse, changes the one image, and leaves the
        figure's other sliders where they were (the sliders of a figure act jointly)."""
        figures = visit.page.locator("article figure.posenc-slider")
        assert figures.count() == visit.facts["sliders"]
        for index in range(figures.count()):
            figure = figures.nth(index)
            assert figure.locator("img").count() == 1, f"slider figure {index} has several images"
            rows = figure.locator(".posenc-slider-controls")
            for row_index in range(rows.count()):
                self._check_slider(visit, figure, rows, row_index, f"figure {index}")
        assert not visit.traffic.problems(), visit.traffic.problems()

    @staticmethod
    def _check_slider(visit, figure, rows, row_index, figure_name):
        row = rows.nth(row_index)
        name = row.locator("label").inner_text()
        where = f"{figure_name}, slider {row_index} ({name!r})"
        control = row.locator('input[type="range"]')
        others = [rows.nth(i).locator('input[type="range"]') for i in range(rows.count()) if i != row_index]
        kept = [other.input_value() for other in others]
        control.scroll_into_view_if_needed()
        control.focus()
        top = int(control.get_attribute("max"))
        assert top >= 1, f"{where} has a single frame"
        start, start_frame = int(control.input_value()), figure.evaluate(FINGERPRINT_JS)
        start_label = row.locator("output").inner_text()
        key, step = ("ArrowRight", 1) if start < top else ("ArrowLeft", -1)
        control.press(key)
        assert int(control.input_value()) == start + step, f"{where}: {key} did not move it"
        assert figure.evaluate(FINGERPRINT_JS) != start_frame, f"{where}: {key} did not change the frame"
        assert row.locator("output").inner_text() != start_label, f"{where}: {key} did not change the label"
        assert [other.input_value() for other in others] == kept, f"{where}: moving it moved another slider"
        control.press("End")
        assert int(control.input_value()) == top, f"{where}: End did not reach the last value"
        end_frame = figure.evaluate(FINGERPRINT_JS)
        control.press("Home")
        assert int(control.input_value()) == 0, f"{where}: Home did not reach the first value"
        assert figure.evaluate(FINGERPRINT_JS) != end_frame, f"{where}: first and last frames are the same"
        # the mouse: press on the track's left end and drag past its right end
        box = control.bounding_box()
        y = box["y"] + box["height"] / 2
        visit.page.mouse.move(box["x"] + 2, y)
        visit.page.mouse.down()
        visit.page.mouse.move(box["x"] + box["width"] + 40, y, steps=8)
        visit.page.mouse.up()
        assert int(control.input_value()) == top, (
            f"{where}: dragging past the end with the mouse stopped at {control.input_value()} of {top} "
            "(does the track move while the value label changes width?)"
        )
        assert figure.evaluate(FINGERPRINT_JS) == end_frame, f"{where}: mouse and keyboard show different frames"
        assert [other.input_value() for other in others] == kept, f"{where}: moving it moved another slider"
        figure.locator("img").evaluate("img => img.complete || new Promise(r => { img.onload = img.onerror = r; })")
        assert figure.locator("img").evaluate("img => img.naturalWidth > 0"), f"{where}: the last frame did not load"

    def test_visible_code_share(self, visit, page_facts):
        counts = visit.code_share
        share = counts["code"] / max(1, counts["code"] + counts["text"])
        page_facts.setdefault(visit.book_page.entry, {})["code_share"] = share
        assert share <= CODE_SHARE_LIMIT, (
            f"{visit.book_page}: visible code is {share:.0%} of the text ({counts['code']} code characters in "
            f"{counts['visibleCells']} of {counts['cells']} cells, {counts['text']} text characters), over "
            f"{CODE_SHARE_LIMIT:.0%}: fold drawing/set-up/check cells (hide-input)"
        )

    def test_images_are_sharp(self, visit, page_facts):
        raster = [image for image in visit.images if not image["vector"]]
        ratios = [image["natural"] / image["shown"] for image in raster]
        page_facts.setdefault(visit.book_page.entry, {})["min_ratio"] = min(ratios) if ratios else None
        blurry = [
            f"{image['src']}: {image['natural']} px shown at {image['shown']} px"
            for image, ratio in zip(raster, ratios)
            if ratio < MIN_IMAGE_RATIO
        ]
        assert not blurry, f"images with fewer than {MIN_IMAGE_RATIO:g} pixels per CSS px: {blurry[:5]}"

    def test_figure_text_is_legible(self, visit, page_facts):
        sizes = [image["textPx"] for image in visit.images if image["textPx"] is not None]
        phone = [image["textPx"] for image in visit.phone_images if image["textPx"] is not None]
        row = page_facts.setdefault(visit.book_page.entry, {})
        row["min_text_px"] = min(sizes) if sizes else None
        row["min_text_px_phone"] = min(phone) if phone else None
        unmeasured = [
            image["src"]
            for image in visit.images
            if image["textPx"] is None and not image["vector"] and visit.book_page.is_notebook
        ]
        assert not unmeasured, f"figures without data-min-font-pt/data-fig-width-in: {unmeasured[:5]}"
        small = sorted(size for size in sizes if size < MIN_FIGURE_TEXT_PX)
        assert not small, (
            f"{visit.book_page}: {len(small)} figures have text below {MIN_FIGURE_TEXT_PX:g} CSS px at "
            f"{DESKTOP['width']} px (smallest {small[0]:.1f}): larger fonts or narrower figures"
        )

    def test_page_weight(self, visit, page_weights, page_facts):
        weight = visit.traffic.weight
        page_facts.setdefault(visit.book_page.entry, {})["weight"] = weight
        page_weights[visit.book_page.entry] = {
            "total": weight,
            "html": visit.traffic.loaded.get("/" + visit.book_page.html, 0),
            "gzip": visit.traffic.gzip_weight,
            "files": len(visit.traffic.loaded),
        }
        assert visit.traffic.loaded, "nothing was loaded"
        assert weight <= WEIGHT_LIMIT, (
            f"{visit.book_page} weighs {weight / MB:.2f} MB (HTML + every file it loads "
            f"when scrolled through), over the {WEIGHT_LIMIT / MB:.0f} MB limit: "
            "fewer figures or frames, fewer colours"
        )

    def test_screenshots_saved(self, visit):
        for width in ("desktop", "phone"):
            path = screenshot_path(visit.book_page.entry, width)
            assert path.exists() and path.stat().st_size > 5_000, f"no {width} screenshot at {path}"

    def test_previous_and_next(self, visit):
        """The links point to the neighbours in _toc.yml order, and clicking them there and back works."""
        position = PAGES.index(visit.book_page)
        base = visit.url[: -len(visit.book_page.html)]
        expected_prev = base + PAGES[position - 1].html if position > 0 else None
        expected_next = base + PAGES[position + 1].html if position + 1 < len(PAGES) else None
        assert visit.facts["prev"] == expected_prev, f"previous link {visit.facts['prev']}, expected {expected_prev}"
        assert visit.facts["next"] == expected_next, f"next link {visit.facts['next']}, expected {expected_next}"
        there, back = ("a.right-next", "a.left-prev") if expected_next else ("a.left-prev", "a.right-next")
        target = expected_next or expected_prev
        assert target, "a book of one page"
        # runs last in the class: it navigates the shared page away
        for selector, url in ((there, target), (back, visit.url)):
            visit.page.locator(selector).click()
            visit.page.wait_for_url(url, timeout=15_000)
            visit.page.wait_for_load_state("networkidle")
        assert not visit.traffic.problems(), visit.traffic.problems()


def search_case() -> tuple[str, BookPage]:
    """("rotary", the RoPE chapter) once notebooks/06_rope.ipynb exists; before that a word of a chapter title."""
    rope = next((page for page in PAGES if page.entry == "notebooks/06_rope"), None)
    if rope is not None:
        return "rotary", rope
    chapter = next(page for page in PAGES if page.is_notebook)
    title = json.loads((ROOT / f"{chapter.entry}.ipynb").read_text())["cells"][0]["source"]
    title = "".join(title).splitlines()[0]
    return max(re.findall(r"[A-Za-z]+", title), key=len).lower(), chapter


def test_search_finds_the_chapter(open_page, base_url):
    query, expected = search_case()
    page, traffic = open_page(base_url + PAGES[0].html)
    page.keyboard.press("Control+k")  # as a reader does: the theme's search dialog
    box = page.locator("#pst-search-dialog input[name='q']")
    box.fill(query)
    box.press("Enter")
    page.wait_for_url(re.compile(r"/search\.html\?q=" + query), timeout=15_000)
    page.wait_for_function(
        "() => { const h = document.querySelector('#search-results h2');"
        " return h && h.textContent === 'Search Results'; }",
        timeout=30_000,
    )
    found = page.eval_on_selector_all("#search-results ul.search li a", "links => links.map(a => a.href)")
    pages_found = {urlsplit(href).path.lstrip("/") for href in found}
    assert expected.html in pages_found, f"searching {query!r} found {sorted(pages_found)}, not {expected.html}"
    assert not traffic.problems(), traffic.problems()
