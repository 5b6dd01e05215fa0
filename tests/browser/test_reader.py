"""What a reader does beyond reading: the front page's figure, dark mode, the icons, the favicon."""

from __future__ import annotations

import pytest
from browser_support import PAGES_WITH_FIGURES, book_pages

pytestmark = pytest.mark.browser
FRONT = book_pages()[0]


def hero_state(page) -> dict:
    return page.evaluate("""() => ({svg: document.querySelector('#posenc-hero svg').innerHTML,
                                   dot: document.querySelector('#posenc-hero-dot').textContent,
                                   position: document.querySelector('#posenc-hero-position').value,
                                   shift: document.querySelector('#posenc-hero-shift').value})""")


def test_front_page_figure_rotates_and_keeps_the_dot_product(open_page, base_url):
    page, traffic = open_page(base_url + FRONT.html)
    assert page.locator("#posenc-hero svg line").count() == 8, "four pairs of q and k: eight arrows"
    start = hero_state(page)
    position = page.locator("#posenc-hero-position")
    position.focus()
    position.press("ArrowRight")
    moved = hero_state(page)
    assert moved["position"] != start["position"]
    assert moved["svg"] != start["svg"], "moving the position slider did not change the drawing"
    assert moved["dot"] != start["dot"], "moving q alone did not change q·k"
    shift = page.locator("#posenc-hero-shift")
    shift.focus()
    for _ in range(5):
        shift.press("ArrowRight")
        shifted = hero_state(page)
        assert shifted["svg"] != moved["svg"], "shifting both did not turn the vectors"
        assert shifted["dot"] == moved["dot"], f"shifting both changed q·k: {moved['dot']} -> {shifted['dot']}"
        assert shifted["position"] == moved["position"], "the shift slider moved the position slider"
    assert float(shifted["shift"]) == 5
    assert not traffic.problems(), traffic.problems()


def test_front_page_figure_fits_a_phone(open_page, base_url):
    page, traffic = open_page(base_url + FRONT.html, viewport={"width": 390, "height": 844})
    box = page.locator("#posenc-hero svg").bounding_box()
    assert box["width"] <= 390, f"the figure is {box['width']} px wide on a 390 px phone"
    # the pair labels: font-size 19 in the SVG's own units, scaled to its displayed width
    size = page.evaluate("""() => { const svg = document.querySelector('#posenc-hero svg');
        const text = svg.querySelector('text'); return text.getBoundingClientRect().height; }""")
    assert size >= 11, f"pair labels are {size:.1f} px tall on a phone"
    assert not traffic.problems(), traffic.problems()


@pytest.mark.skipif(not PAGES_WITH_FIGURES, reason="no chapter with figures")
def test_a_tap_enlarges_a_figure_on_a_phone(open_page, base_url):
    page, traffic = open_page(base_url + PAGES_WITH_FIGURES[0].html, viewport={"width": 390, "height": 844})
    image = page.locator("article img.posenc-img").first
    image.scroll_into_view_if_needed()
    fitted = image.bounding_box()["width"]
    assert fitted <= 390, f"a figure is {fitted:.0f} px wide on a 390 px phone before any tap"
    image.click()
    enlarged = image.bounding_box()["width"]
    assert enlarged >= 1.4 * fitted, f"a tap took the figure from {fitted:.0f} to {enlarged:.0f} px"
    image.click(position={"x": 20, "y": 20})
    assert image.bounding_box()["width"] == fitted, "a second tap did not fit the figure to the column again"
    assert not traffic.problems(), traffic.problems()


@pytest.mark.skipif(not PAGES_WITH_FIGURES, reason="no chapter with figures")
def test_dark_mode_figures_are_not_white_slabs(open_page, base_url):
    page, traffic = open_page(base_url + PAGES_WITH_FIGURES[0].html)
    image = page.locator("article img.posenc-img").first
    assert image.evaluate("img => getComputedStyle(img).filter") == "none", "light mode must show figures as drawn"
    button = page.locator("button.theme-switch-button").first
    for _ in range(3):  # the theme's toggle cycles light -> dark -> auto
        if page.evaluate("() => document.documentElement.dataset.theme") == "dark":
            break
        button.click()
    assert page.evaluate("() => document.documentElement.dataset.theme") == "dark"
    assert "invert" in image.evaluate("img => getComputedStyle(img).filter"), "dark mode leaves figures white"
    # what the reader sees: the figure's mean brightness is dark, like the page around it
    image.scroll_into_view_if_needed()
    shot = image.screenshot()
    from io import BytesIO

    from PIL import Image, ImageStat

    mean = ImageStat.Stat(Image.open(BytesIO(shot)).convert("L")).mean[0]
    assert mean < 100, f"a dark-mode figure has mean brightness {mean:.0f} of 255"
    assert not traffic.problems(), traffic.problems()


def test_theme_icons_are_drawn_without_font_awesome(open_page, base_url):
    page, traffic = open_page(base_url + FRONT.html)
    loaded = " ".join(traffic.loaded)  # (its web fonts stay: the theme's CSS draws a few icons with them)
    assert "fontawesome.js" not in loaded, "the 1.5 MB Font Awesome script is still loaded"
    page.wait_for_function(
        "() => document.querySelector('button.theme-switch-button svg.svg-inline--fa')", timeout=10_000
    )
    missing = page.evaluate("""() => Array.from(document.querySelectorAll('i[class*="fa-"]'))
        .filter(i => i.offsetParent !== null || !i.previousElementSibling
                     || i.previousElementSibling.tagName.toLowerCase() !== 'svg')
        .map(i => i.className)""")
    assert not missing, f"icons not drawn: {missing}"
    assert not traffic.problems(), traffic.problems()


def test_favicon_is_declared_and_served(open_page, base_url):
    page, traffic = open_page(base_url + FRONT.html)
    href = page.evaluate("() => (document.querySelector('link[rel~=icon]') || {}).href")
    assert href, "no <link rel=icon>: browsers ask for /favicon.ico and log a 404"
    response = page.request.get(href)
    assert response.ok, f"{href}: HTTP {response.status}"
    assert not traffic.problems(), traffic.problems()
