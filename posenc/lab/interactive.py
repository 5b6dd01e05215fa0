"""One helper behind every figure of the book.

From a single drawing function ``draw(fig, **values)`` an :class:`InteractiveFigure` gives

* a **live** ipywidgets slider per parameter where a kernel runs it (Jupyter, Colab; only API common to
  ipywidgets 7.7 and 8 is used), and
* a **static** slider per parameter over precomputed frames, plain HTML + a few lines of JavaScript, for the
  built web book where no kernel runs (no ipywidgets view, no CDN, no dead control).

Which one :meth:`InteractiveFigure.show` displays is decided by :func:`figure_mode`: the environment variable
``POSENC_FIGURES`` (``"static"`` or ``"live"``) wins; otherwise live inside a kernel and static elsewhere.
The book build sets ``POSENC_FIGURES=static``.

A figure with several sliders is ONE static figure whose sliders act jointly: its frames are precomputed over
the product of the sliders' values, each slider subsampled evenly (ends kept) to at most ``max_frames`` values
and the product to at most ``max_total_frames`` (the largest count shrinks first). :func:`show_figure`
displays an ordinary figure with its caption as alt text.

Static images (``show_figure`` and static frames) are rendered by :mod:`posenc.lab.figure_images` (its docstring
says at what size, with which font facts, and where the files go); :func:`show_figure` and the names the book's
tools read (:data:`STATIC_WIDTH_PX`, :data:`FRAMES_DIR_ENV`, :func:`frames_dir`) are importable from here too.

Live redraws are kept fast (what a dragged slider waits for): the figure is laid out once by matplotlib's
constrained layout and that layout is then reused for every redraw with the same axes, and live frames are PNGs
with light zlib compression; a figure made with ``keep_axes=True`` is built once and then only updated in
place (see :class:`InteractiveFigure`). The static frames of a figure (the web book) share the layout computed
for its default frame the same way (its axes hold still while a slider moves), are drawn at 2x and quantised to
a few colours (no PNG optimisation pass: it would cost more than the drawing at this size). Setting
``POSENC_REDRAW_LOG=<file>`` makes every displayed figure time its live redraws and append one
JSON line per figure to that file (``benchmarks/run.py`` does this for every figure of the book).
"""

from __future__ import annotations

import html
import inspect
import itertools
import json
import math
import os
import time
from typing import Callable, Sequence

from .figure_images import (  # noqa: F401 - show_figure, STATIC_WIDTH_PX, FRAMES_DIR_ENV, frames_dir: importable here
    FRAMES_DIR_ENV,
    STATIC_WIDTH_PX,
    StaticImage,
    _all_axes,
    _render_live_png,
    frames_dir,
    render_static,
    show_figure,
)

_ids = itertools.count()


def figure_mode() -> str:
    """``"live"`` or ``"static"``: see the module docstring."""
    chosen = os.environ.get("POSENC_FIGURES", "").strip().lower()
    if chosen in ("live", "static"):
        return chosen
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return "static"
    return "live" if shell is not None and "IPKernelApp" in getattr(shell, "config", {}) else "static"


REDRAW_LOG_ENV = "POSENC_REDRAW_LOG"
BOOK_STYLE = os.path.join(os.path.dirname(__file__), "book.mplstyle")


def use_book_style() -> None:
    """Apply the book's matplotlib style (``posenc/lab/book.mplstyle``) to every figure made from now on."""
    import matplotlib.style

    matplotlib.style.use(BOOK_STYLE)


def _census(fig) -> tuple:
    """The figure's axes (the objects themselves, compared by identity) and how many artists it and each axes
    hold."""
    axes = _all_axes(fig)
    return tuple(axes), len(fig.get_children()), tuple(len(ax.get_children()) for ax in axes)


def _axes_signature(fig) -> tuple:
    return tuple((type(ax).__name__, ax.get_label()) for ax in _all_axes(fig))


def _label(value) -> str:
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        return f"{float(value):.4g}"
    return str(value)


def _subsample(values: Sequence, max_frames: int) -> list:
    values = list(values)
    if len(values) <= max_frames:
        return values
    step = (len(values) - 1) / (max_frames - 1)
    return [values[round(i * step)] for i in range(max_frames)]


class InteractiveFigure:
    """``draw(fig, **values)`` redrawn for slider values; see the module docstring.

    ``sliders``: name -> sequence of values; ``defaults``: name -> starting value (default: the middle one).

    ``keep_axes=True``: from the second live redraw on (and the second static frame on), redraws with the frozen
    layout do not clear the figure: ``draw`` is called on the figure as it left it and updates its artists in place
    (``set_data``, titles, ``relim``), which skips re-creating axes and ticks (most of a redraw's cost).
    :meth:`update` always draws afresh. Such a ``draw`` builds the figure when ``fig.axes`` is empty; otherwise it
    creates nothing and resets every property that depends on a slider. A redraw that replaces an axes or changes
    how many artists the figure or an axes holds raises a ``ValueError`` (and the next redraw starts afresh).
    """

    def __init__(
        self,
        draw: Callable,
        sliders: dict,
        caption: str,
        *,
        defaults: dict | None = None,
        figsize=(6.4, 3.6),
        dpi: int = 72,
        max_frames: int = 30,
        max_total_frames: int = 64,
        max_bytes: int = 1_500_000,
        colors: int | None = 64,
        keep_axes: bool = False,
    ):
        if not callable(draw):
            raise TypeError(f"draw must be callable as draw(fig, **values), got {type(draw).__name__}")
        if not isinstance(sliders, dict) or not sliders:
            raise ValueError("sliders must be a non-empty dict: name -> sequence of values")
        if not caption or not isinstance(caption, str):
            raise ValueError("caption must be a non-empty str: it is the figure's caption and alt text")
        if not isinstance(max_frames, int) or max_frames < 2:
            raise ValueError(f"max_frames must be an int >= 2, got {max_frames!r}")
        if not isinstance(max_total_frames, int) or max_total_frames < 2:
            raise ValueError(f"max_total_frames must be an int >= 2, got {max_total_frames!r}")
        self.draw, self.caption = draw, caption
        self.sliders = {}
        for name, values in sliders.items():
            values = list(values)
            if len(values) < 2:
                raise ValueError(f"slider {name!r} needs at least two values, got {len(values)}")
            self.sliders[name] = values
        self.defaults = {name: values[len(values) // 2] for name, values in self.sliders.items()}
        for name, value in (defaults or {}).items():
            if name not in self.sliders:
                raise ValueError(f"defaults names {name!r}, which is not a slider ({list(self.sliders)})")
            self.defaults[name] = value
        self.dpi, self.max_frames, self.max_bytes, self.colors = dpi, max_frames, max_bytes, colors
        self.max_total_frames = max_total_frames
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
        self._frozen_layout = None  # (axes signature, their positions) once a live redraw has been laid out
        if not isinstance(keep_axes, bool):
            raise TypeError(f"keep_axes must be a bool, got {type(keep_axes).__name__}")
        self.keep_axes = keep_axes
        self._axes_kept = False  # whether the figure holds the axes of the last frozen-layout redraw

    def update(self, **values):
        """Redraw the figure for ``values`` (missing names take their defaults); returns the figure.

        Constrained layout runs when the figure is drawn (the quality of a static frame).
        """
        return self._redraw(values, live=False)

    def _redraw(self, values: dict, live: bool):
        """``live=True`` reuses the layout computed by the first live redraw whenever the figure has the same
        axes (constrained layout is about half the cost of a redraw)."""
        unknown = set(values) - set(self.sliders)
        if unknown:
            raise ValueError(f"unknown slider names {sorted(unknown)}; sliders are {list(self.sliders)}")
        fig = self.figure
        chosen = {**self.defaults, **values}
        frozen = self._frozen_layout if live else None
        if frozen and self._axes_kept:
            before = _census(fig)
            self.draw(fig, **chosen)
            if _census(fig) != before:
                fig.clear()
                self._axes_kept = False
                raise ValueError(
                    f"draw changed the axes or the number of artists on a keep_axes redraw of "
                    f"{self.caption!r}; with keep_axes=True it must build the figure only when fig.axes "
                    "is empty and afterwards update what it built (or pass keep_axes=False)"
                )
            return fig
        fig.clear()
        self._axes_kept = False
        fig.set_layout_engine("none" if frozen else "constrained")
        self.draw(fig, **chosen)
        if not live:
            return fig
        if frozen and frozen[0] == _axes_signature(fig):
            for ax, position in zip(_all_axes(fig), frozen[1]):
                ax.set_position(position)
            self._axes_kept = self.keep_axes
            return fig
        if frozen:  # different axes this time: lay them out afresh (a colorbar may not change engines)
            fig.clear()
            fig.set_layout_engine("constrained")
            self.draw(fig, **chosen)
        engine = fig.get_layout_engine()
        if engine is not None:  # a draw function may lay out by hand (set_layout_engine(None), subplots_adjust)
            engine.execute(fig)
        self._frozen_layout = (_axes_signature(fig), [ax.get_position(original=True) for ax in _all_axes(fig)])
        fig.set_layout_engine("none")
        self._axes_kept = self.keep_axes
        return fig

    def live_png(self, **values) -> bytes:
        """One live frame: redraw for ``values`` with the frozen layout and encode it (what a widget shows)."""
        self._redraw(values, live=True)
        return _render_live_png(self.figure)

    def redraw_times(self, repeats: int = 5, cpu: bool = False, **values) -> list[float]:
        """Wall times of ``repeats`` live updates, after one untimed update that lays the figure out.

        Without ``values`` the updates step through the sliders' values (each slider in turn, evenly spread),
        as a hand dragging them does; with ``values`` every update draws those. ``cpu=True`` returns
        ``(wall, cpu)`` lists instead, ``cpu`` being the process time of each update (what it costs on a core of
        its own: on a busy machine the wall time also counts the waits for a core).
        """
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        plan = [values] * repeats if values else _slider_walk(self.sliders, repeats)
        self.live_png(**plan[0])
        wall, process = [], []
        for chosen in plan:
            start, start_cpu = time.perf_counter(), time.process_time()
            self.live_png(**chosen)
            wall.append(time.perf_counter() - start)
            process.append(time.process_time() - start_cpu)
        return (wall, process) if cpu else wall

    def _log_redraws(self) -> None:
        path = os.environ.get(REDRAW_LOG_ENV)
        if not path:
            return
        wall, process = self.redraw_times(repeats=7, cpu=True)
        record = {
            "caption": self.caption,
            "sliders": {k: len(v) for k, v in self.sliders.items()},
            "median_ms": round(1e3 * sorted(wall)[len(wall) // 2], 1),
            "max_ms": round(1e3 * max(wall), 1),
            "median_cpu_ms": round(1e3 * sorted(process)[len(process) // 2], 1),
            "times_ms": [round(1e3 * t, 1) for t in wall],
            "axes": len(_all_axes(self.figure)),
            "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        }
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")

    # static form -------------------------------------------------------------------------------------------
    def frame_values(self) -> dict:
        """name -> the values the static figure offers: each slider subsampled to ``max_frames`` values, then
        the largest count shrunk (ends kept) until the product is at most ``max_total_frames``."""
        counts = {name: min(len(values), self.max_frames) for name, values in self.sliders.items()}
        while math.prod(counts.values()) > self.max_total_frames and max(counts.values()) > 2:
            largest = max(counts, key=counts.get)
            counts[largest] -= 1
        return {name: _subsample(self.sliders[name], counts[name]) for name in self.sliders}

    def frames(self) -> tuple[dict, list]:
        """``(grid, images)``: :meth:`frame_values` and a :class:`StaticImage` per point of that grid, in C order
        (the last slider fastest)."""
        grid = self.frame_values()
        names = list(grid)
        images = []
        inline = 0
        # one layout for every frame, computed on the default frame: the axes hold still while a slider moves,
        # and the layout solver runs once (as for live redraws) instead of once per frame
        saved, self._frozen_layout = self._frozen_layout, None
        self._redraw(dict(self.defaults), live=True)
        try:
            for point in itertools.product(*grid.values()):
                images.append(self._static_frame(dict(zip(names, point))))
                if images[-1].src.startswith("data:"):
                    inline += len(images[-1].src)
                    if inline > self.max_bytes:
                        raise ValueError(
                            f"the inline static frames of {self.caption!r} pass max_bytes={self.max_bytes:,}; use "
                            "fewer values (max_frames, max_total_frames), a smaller figsize, or fewer colors "
                            f"(or set {FRAMES_DIR_ENV} to write frames as files)"
                        )
        finally:
            self._frozen_layout, self._axes_kept = saved, False
        return grid, images

    def _static_frame(self, values: dict) -> StaticImage:
        return render_static(self._redraw(values, live=True), self.colors)

    def static_html(self) -> str:
        """One figure: the default frame and a range input per slider, acting jointly on one image."""
        grid, images = self.frames()
        uid = f"posenc-slider-{os.getpid()}-{next(_ids)}"
        names = list(grid)
        labels = [[_label(v) for v in grid[name]] for name in names]
        start = [_closest_index(grid[name], self.defaults[name]) for name in names]
        flat = 0
        for name, index in zip(names, start):
            flat = flat * len(grid[name]) + index
        shown = ", ".join(f"{name} = {label[i]}" for name, label, i in zip(names, labels, start))
        alt = html.escape(f"{self.caption} ({shown})", quote=True)
        image = images[flat]
        rows = []
        for k, name in enumerate(names):
            esc = html.escape(name)
            rows.append(
                f'<div class="posenc-slider-controls" style="display:flex;gap:0.6em;align-items:center">'
                f'<label for="{uid}-{k}">{esc}</label>'
                f'<input type="range" id="{uid}-{k}" min="0" max="{len(grid[name]) - 1}" step="1" '
                f'value="{start[k]}" aria-label="{esc}" style="flex:1">'
                f'<output for="{uid}-{k}">{html.escape(labels[k][start[k]])}</output></div>'
            )
        sliders = ", ".join(names)
        return f"""<figure class="posenc-slider" id="{uid}" data-sliders="{html.escape(sliders, quote=True)}">
<img class="posenc-img" src="{html.escape(image.src, quote=True)}" alt="{alt}" {image.attributes()}>
{chr(10).join(rows)}
<figcaption>{html.escape(self.caption)} (slider{"s" if len(names) > 1 else ""}: {html.escape(sliders)})</figcaption>
</figure>
<script>
(function () {{
  var frames = {json.dumps([im.src for im in images])};
  var labels = {json.dumps(labels)};
  var names = {json.dumps(names)};
  var root = document.getElementById("{uid}");
  var img = root.querySelector("img");
  var ranges = root.querySelectorAll("input[type=range]"), outs = root.querySelectorAll("output");
  function show() {{
    var flat = 0, shown = [];
    for (var k = 0; k < ranges.length; k++) {{
      var i = parseInt(ranges[k].value, 10);
      flat = flat * labels[k].length + i;
      outs[k].textContent = labels[k][i];
      shown.push(names[k] + " = " + labels[k][i]);
    }}
    img.src = frames[flat];
    img.alt = {json.dumps(self.caption)} + " (" + shown.join(", ") + ")";
  }}
  for (var k = 0; k < ranges.length; k++) ranges[k].addEventListener("input", show);
}})();
</script>"""

    # live form ---------------------------------------------------------------------------------------------
    def widget(self):
        """An ipywidgets ``VBox``: one ``SelectionSlider`` per parameter above an ``Image`` of the figure.

        Each slider move redraws the figure and sends one PNG (no notebook output is rewritten).
        """
        import ipywidgets as widgets

        image = widgets.Image(format="png")
        controls = {}
        for name, values in self.sliders.items():
            labels = _unique_labels(values)
            controls[name] = widgets.SelectionSlider(
                options=list(zip(labels, range(len(values)))),
                value=_closest_index(values, self.defaults[name]),
                description=name,
                continuous_update=True,
                layout=widgets.Layout(width="70%"),
            )

        def refresh(change=None):
            chosen = {name: self.sliders[name][control.value] for name, control in controls.items()}
            image.value = self.live_png(**chosen)

        for control in controls.values():
            control.observe(refresh, names="value")
        refresh()
        return widgets.VBox([*controls.values(), image])

    def show(self):
        """Display the live widget or the static slider, as :func:`figure_mode` decides."""
        from IPython.display import HTML, display

        if figure_mode() == "live":
            display(self.widget())
        else:
            display(HTML(self.static_html()))
        self._log_redraws()
        return None


#: The keyword-only options of :class:`InteractiveFigure` (``defaults``, ``figsize``, ``dpi``, ...), which
#: :func:`interactive_figure` tells apart from slider names.
FIGURE_OPTIONS = tuple(
    name
    for name, parameter in inspect.signature(InteractiveFigure.__init__).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
)


def _as_float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _closest_index(values, target) -> int:
    """The index of ``target`` in ``values`` if it is there, else of the numerically closest value (a label that is
    not a number, such as an encoding's name, is found only by equality)."""
    for index, value in enumerate(values):
        if isinstance(value, type(target)) and value == target:
            return index
    return min(range(len(values)), key=lambda i: abs(_as_float(values[i]) - _as_float(target)))


def _slider_walk(sliders: dict, count: int) -> list[dict]:
    """``count`` slider settings that move one slider at a time across its range (the others at rest)."""
    names = list(sliders)
    plan = []
    for i in range(count):
        name = names[i % len(names)]
        values = sliders[name]
        step = i // len(names)
        per_slider = -(-count // len(names))
        plan.append({name: values[round(step * (len(values) - 1) / max(per_slider - 1, 1))]})
    return plan


def _unique_labels(values) -> list[str]:
    labels = [_label(v) for v in values]
    if len(set(labels)) < len(labels):
        labels = [f"{i}: {label}" for i, label in enumerate(labels)]
    return labels


def interactive_figure(draw: Callable, caption: str, *, show: bool = True, **sliders) -> InteractiveFigure:
    """Build an :class:`InteractiveFigure` from ``draw(fig, **values)`` and slider ``name=values``; show it.

    A keyword named as one of :class:`InteractiveFigure`'s options (:data:`FIGURE_OPTIONS`: ``defaults``,
    ``figsize``, ``dpi``, ``max_frames``, ...) is that option; every other keyword is a slider.
    """
    options = {name: sliders.pop(name) for name in FIGURE_OPTIONS if name in sliders}
    figure = InteractiveFigure(draw, sliders, caption, **options)
    if show:
        figure.show()
    return figure
