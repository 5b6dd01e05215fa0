"""Figures as images: the static PNGs of the web book (:func:`show_figure`, the frames of a static slider) and the
live frames of a slider.

Static images (``show_figure`` and static frames) are rendered at :data:`STATIC_WIDTH_PX` pixels wide, twice
the ~740 CSS px of the book's text column, and displayed at the column's width: sharp on HiDPI screens.
Each ``<img>`` carries ``data-min-font-pt`` (the smallest font size, in points, of the figure's visible
texts) and ``data-fig-width-in`` (the saved figure's width in inches), so that the smallest text in CSS px
is ``min_font_pt * displayed_width / (72 * fig_width_in)`` (tests/browser checks it).

Where the images go: with ``POSENC_FRAMES_DIR`` set (``make book`` sets it), every static image is written
there once as a content-addressed PNG (``<sha1>.png``) and referenced by ``POSENC_FRAMES_URL`` (default
``../_static/frames/``, relative to a chapter page) + its name; book/tools/build_html.py copies the files a
page refers to into the site. A slider swaps ``<img src>`` among URLs written inline in the page (works from
``file://``, no fetch). Without ``POSENC_FRAMES_DIR`` images are inline data URIs, and the inline frames of
one figure may not exceed ``max_bytes`` (a ``ValueError`` says so and what to shrink).
"""

from __future__ import annotations

import base64
import html
import io
import os

LIVE_PNG_COMPRESSION = 1  # zlib level of live frames: 1 encodes several times faster than the default 6


def _draw_image(fig):
    """The figure drawn by Agg at its current dpi, as a PIL RGBA image."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)


def _render_live_png(fig) -> bytes:
    """The figure as a PNG at its own dpi, encoded with light compression (a live frame)."""
    buffer = io.BytesIO()
    _draw_image(fig).save(buffer, format="png", compress_level=LIVE_PNG_COMPRESSION)
    return buffer.getvalue()


def _all_axes(fig) -> list:
    """Every axes of ``fig``, subfigures included, in creation order."""
    axes = list(fig.axes)
    for sub in getattr(fig, "subfigs", []):
        axes += _all_axes(sub)
    return axes


STATIC_WIDTH_PX = 1600  # natural width of static images: >= 2x the ~740 CSS px text column at 1280 px


FRAMES_DIR_ENV, FRAMES_URL_ENV = "POSENC_FRAMES_DIR", "POSENC_FRAMES_URL"


DEFAULT_FRAMES_URL = "../_static/frames/"


STATIC_COLORS = 256  # show_figure images are quantised to this many colours (slider frames: ``colors``, 64)


def static_dpi(fig) -> float:
    """The dpi at which ``fig`` renders :data:`STATIC_WIDTH_PX` pixels wide."""
    return STATIC_WIDTH_PX / fig.get_figwidth()


def _min_font_pt(fig) -> float | None:
    """Smallest font size (points) among the figure's visible, non-empty texts (tick labels included)."""
    from matplotlib.text import Text

    hidden = set()  # tick labels of axes drawn without axis (imshow with axis("off"), hidden axes)
    for ax in _all_axes(fig):
        if not ax.get_visible() or not ax.axison:
            for axis in ax._axis_map.values() if hasattr(ax, "_axis_map") else (ax.xaxis, ax.yaxis):
                for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                    hidden.update((id(tick.label1), id(tick.label2)))
        if not ax.get_visible():
            hidden.update(id(t) for t in ax.findobj(Text))
    sizes = [
        t.get_fontsize() for t in fig.findobj(Text) if id(t) not in hidden and t.get_visible() and t.get_text().strip()
    ]
    return min(sizes) if sizes else None


class StaticImage:
    """One rendered static image: its ``src`` (URL or data URI), pixel size, and font facts."""

    def __init__(self, src: str, width: int, height: int, min_font_pt: float | None, fig_width_in: float, nbytes: int):
        self.src, self.width, self.height = src, width, height
        self.min_font_pt, self.fig_width_in, self.nbytes = min_font_pt, fig_width_in, nbytes

    def attributes(self) -> str:
        font = f' data-min-font-pt="{self.min_font_pt:.3g}"' if self.min_font_pt else ""
        return f'width="{self.width}" height="{self.height}"{font} data-fig-width-in="{self.fig_width_in:.4g}"'


def _static_png(fig, colors: int | None) -> tuple[bytes, int, int]:
    """``fig`` drawn at :func:`static_dpi` and encoded (quantised to ``colors`` if given): png, width, height."""
    from PIL import Image

    original_dpi = fig.dpi
    try:
        fig.set_dpi(static_dpi(fig))
        image = _draw_image(fig).convert("RGB")
        if colors:
            image = image.quantize(colors=colors, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
        buffer = io.BytesIO()
        image.save(buffer, format="png", compress_level=6)
    finally:
        fig.set_dpi(original_dpi)
    return buffer.getvalue(), image.width, image.height


def render_static(fig, colors: int | None = STATIC_COLORS) -> StaticImage:
    """Render ``fig`` as a static image (see the module docstring for where it goes)."""
    data, width, height = _static_png(fig, colors)
    min_font = _min_font_pt(fig)  # after the draw: tick labels exist and have their positions
    return StaticImage(_image_src(data), width, height, min_font, width / static_dpi(fig), len(data))


def frames_dir() -> str | None:
    """Where static images are written as files, or None for inline data URIs.

    ``POSENC_FRAMES_DIR`` if set (empty: data URIs); else, when the book's tools ask for static figures
    (``POSENC_FIGURES=static``) and posenc is the book's own checkout, ``_build/frames`` of that checkout.
    """
    chosen = os.environ.get(FRAMES_DIR_ENV)
    if chosen is not None:
        return chosen.strip() or None
    if os.environ.get("POSENC_FIGURES", "").strip().lower() == "static":
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # posenc/lab/ -> checkout
        if os.path.exists(os.path.join(root, "_toc.yml")):
            return os.path.join(root, "_build", "frames")
    return None


def _image_src(data: bytes) -> str:
    """A URL of a content-addressed file in :func:`frames_dir` when there is one, else a data URI."""
    directory = frames_dir()
    if not directory:
        return "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    import hashlib

    name = hashlib.sha1(data).hexdigest()[:20] + ".png"
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    return os.environ.get(FRAMES_URL_ENV, DEFAULT_FRAMES_URL) + name


def _figure_html(image: StaticImage, caption: str) -> str:
    alt = html.escape(caption, quote=True)
    return (
        f'<figure class="posenc-figure"><img class="posenc-img" src="{html.escape(image.src, quote=True)}" '
        f'alt="{alt}" {image.attributes()} loading="lazy"><figcaption>{html.escape(caption)}</figcaption>'
        "</figure>"
    )


def show_figure(fig, caption: str):
    """Display a finished matplotlib figure as an image whose alt text is ``caption`` (and close it); the image
    is rendered :data:`STATIC_WIDTH_PX` wide."""
    from IPython.display import HTML, display

    if not caption or not isinstance(caption, str):
        raise ValueError("caption must be a non-empty str: it is the figure's alt text")
    image = render_static(fig)
    try:
        import matplotlib.pyplot as plt

        plt.close(fig)
    except Exception:  # a Figure made without pyplot has nothing to close
        pass
    display(HTML(_figure_html(image, caption)))
