"""One helper behind every figure of the book.

From a single drawing function ``draw(fig, **values)`` an :class:`InteractiveFigure` gives

* a **live** ipywidgets slider per parameter where a kernel runs it (Jupyter, Colab; only API common to
  ipywidgets 7.7 and 8 is used), and
* a **static** slider per parameter over precomputed frames, plain HTML + a few lines of JavaScript, for the
  built web book where no kernel runs (no ipywidgets view, no CDN, no dead control).

Which one :meth:`InteractiveFigure.show` displays is decided by :func:`figure_mode`: the environment variable
``POSENC_FIGURES`` (``"static"`` or ``"live"``) wins; otherwise live inside a kernel and static elsewhere.
The book build sets ``POSENC_FIGURES=static``.

Frames are bounded: at most ``max_frames`` per slider (values are subsampled evenly, ends kept), and the
embedded frames of one figure may not exceed ``max_bytes`` (a ``ValueError`` says so and what to shrink).
:func:`show_figure` displays an ordinary figure with its caption as alt text.

Live redraws are kept fast (what a dragged slider waits for): the figure is laid out once by matplotlib's
constrained layout and that layout is then reused for every redraw with the same axes, and live frames are PNGs
with light zlib compression. Static frames (the web book) are laid out afresh and compressed hard, since they are
made once. Setting ``POSENC_REDRAW_LOG=<file>`` makes every displayed figure time its live redraws and append one
JSON line per figure to that file (``benchmarks/run.py`` does this for every figure of the book).
"""
from __future__ import annotations

import base64
import html
import io
import itertools
import json
import os
import time
from typing import Callable, Sequence

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


LIVE_PNG_COMPRESSION = 1  # zlib level of live frames: 1 encodes several times faster than the default 6
REDRAW_LOG_ENV = "POSENC_REDRAW_LOG"
BOOK_STYLE = os.path.join(os.path.dirname(__file__), "book.mplstyle")


def use_book_style() -> None:
    """Apply the book's matplotlib style (``posenc/book.mplstyle``) to every figure made from now on."""
    import matplotlib.style

    matplotlib.style.use(BOOK_STYLE)


def _render_png(fig, dpi) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def _render_live_png(fig) -> bytes:
    """The figure as a PNG at its own dpi, drawn by Agg and encoded with light compression (a live frame)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    buffer = io.BytesIO()
    image.save(buffer, format="png", compress_level=LIVE_PNG_COMPRESSION)
    return buffer.getvalue()


def _all_axes(fig) -> list:
    """Every axes of ``fig``, subfigures included, in creation order."""
    axes = list(fig.axes)
    for sub in getattr(fig, "subfigs", []):
        axes += _all_axes(sub)
    return axes


def _axes_signature(fig) -> tuple:
    return tuple((type(ax).__name__, ax.get_label()) for ax in _all_axes(fig))


def _encode_png(fig, dpi, colors: int | None) -> str:
    data = _render_png(fig, dpi)
    if colors:
        from PIL import Image

        image = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=colors)
        buffer = io.BytesIO()
        image.save(buffer, format="png", optimize=True)
        data = buffer.getvalue()
    return base64.b64encode(data).decode("ascii")


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


def _figure_html(image_b64: str, caption: str) -> str:
    alt = html.escape(caption, quote=True)
    return (f'<figure class="posenc-figure"><img src="data:image/png;base64,{image_b64}" alt="{alt}" '
            f'style="max-width:100%"><figcaption>{html.escape(caption)}</figcaption></figure>')


def show_figure(fig, caption: str, dpi: int = 80):
    """Display a finished matplotlib figure as an image whose alt text is ``caption`` (and close it)."""
    from IPython.display import HTML, display

    if not caption or not isinstance(caption, str):
        raise ValueError("caption must be a non-empty str: it is the figure's alt text")
    image = _encode_png(fig, dpi, colors=None)
    try:
        import matplotlib.pyplot as plt

        plt.close(fig)
    except Exception:  # a Figure made without pyplot has nothing to close
        pass
    display(HTML(_figure_html(image, caption)))


class InteractiveFigure:
    """``draw(fig, **values)`` redrawn for slider values; see the module docstring.

    ``sliders``: name -> sequence of values; ``defaults``: name -> starting value (default: the middle one).
    """

    def __init__(self, draw: Callable, sliders: dict, caption: str, *, defaults: dict | None = None,
                 figsize=(6.4, 3.6), dpi: int = 72, max_frames: int = 30, max_bytes: int = 1_500_000,
                 colors: int | None = 64):
        if not callable(draw):
            raise TypeError(f"draw must be callable as draw(fig, **values), got {type(draw).__name__}")
        if not isinstance(sliders, dict) or not sliders:
            raise ValueError("sliders must be a non-empty dict: name -> sequence of values")
        if not caption or not isinstance(caption, str):
            raise ValueError("caption must be a non-empty str: it is the figure's caption and alt text")
        if not isinstance(max_frames, int) or max_frames < 2:
            raise ValueError(f"max_frames must be an int >= 2, got {max_frames!r}")
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
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
        self._frozen_layout = None  # (axes signature, their positions) once a live redraw has been laid out

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
        fig.clear()
        frozen = self._frozen_layout if live else None
        fig.set_layout_engine("none" if frozen else "constrained")
        self.draw(fig, **{**self.defaults, **values})
        if not live:
            return fig
        if frozen and frozen[0] == _axes_signature(fig):
            for ax, position in zip(_all_axes(fig), frozen[1]):
                ax.set_position(position)
            return fig
        if frozen:  # different axes this time: lay them out afresh (a colorbar may not change engines)
            fig.clear()
            fig.set_layout_engine("constrained")
            self.draw(fig, **{**self.defaults, **values})
        engine = fig.get_layout_engine()
        if engine is not None:  # a draw function may lay out by hand (set_layout_engine(None), subplots_adjust)
            engine.execute(fig)
        self._frozen_layout = (_axes_signature(fig), [ax.get_position(original=True) for ax in _all_axes(fig)])
        fig.set_layout_engine("none")
        return fig

    def live_png(self, **values) -> bytes:
        """One live frame: redraw for ``values`` with the frozen layout and encode it (what a widget shows)."""
        self._redraw(values, live=True)
        return _render_live_png(self.figure)

    def redraw_seconds(self, repeats: int = 5, **values) -> float:
        """Median wall time of one live update (draw + PNG render, what a widget waits for)."""
        return float(sorted(self.redraw_times(repeats, **values))[repeats // 2])

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
        record = {"caption": self.caption, "sliders": {k: len(v) for k, v in self.sliders.items()},
                  "median_ms": round(1e3 * sorted(wall)[len(wall) // 2], 1), "max_ms": round(1e3 * max(wall), 1),
                  "median_cpu_ms": round(1e3 * sorted(process)[len(process) // 2], 1),
                  "times_ms": [round(1e3 * t, 1) for t in wall], "axes": len(_all_axes(self.figure)),
                  "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")

    # static form -------------------------------------------------------------------------------------------
    def frames(self, name: str) -> tuple[list, list[str]]:
        """Values shown by the static slider for ``name`` and their base64 PNG frames."""
        values = _subsample(self.sliders[name], self.max_frames)
        images = [_encode_png(self.update(**{name: value}), self.dpi, self.colors) for value in values]
        return values, images

    def static_html(self) -> str:
        parts, total = [], 0
        for name in self.sliders:
            values, images = self.frames(name)
            total += sum(len(image) for image in images)
            if total > self.max_bytes:
                raise ValueError(
                    f"the static frames of {self.caption!r} take {total:,} bytes, over max_bytes={self.max_bytes:,}; "
                    "use fewer values (max_frames), a smaller figsize or dpi, or fewer colors"
                )
            parts.append(self._slider_html(name, values, images))
        return "\n".join(parts)

    def _slider_html(self, name, values, images) -> str:
        uid = f"posenc-slider-{os.getpid()}-{next(_ids)}"
        labels = [_label(v) for v in values]
        start = _closest_index(values, self.defaults[name])
        others = ", ".join(f"{k} = {_label(v)}" for k, v in self.defaults.items() if k != name)
        caption = self.caption + (f" (slider: {name}; {others})" if others else f" (slider: {name})")
        alt = html.escape(caption, quote=True)
        esc_name = html.escape(name)
        return f"""<figure class="posenc-slider" id="{uid}">
<img src="data:image/png;base64,{images[start]}" alt="{alt}" style="max-width:100%">
<div class="posenc-slider-controls" style="display:flex;gap:0.6em;align-items:center">
<label for="{uid}-range">{esc_name}</label>
<input type="range" id="{uid}-range" min="0" max="{len(values) - 1}" step="1" value="{start}" aria-label="{esc_name}" style="flex:1">
<output id="{uid}-value" for="{uid}-range">{html.escape(labels[start])}</output>
</div>
<figcaption>{html.escape(caption)}</figcaption>
</figure>
<script>
(function () {{
  var frames = {json.dumps(images)};
  var labels = {json.dumps(labels)};
  var root = document.getElementById("{uid}");
  var img = root.querySelector("img"), range = root.querySelector("input"), out = root.querySelector("output");
  range.addEventListener("input", function () {{
    var i = parseInt(range.value, 10);
    img.src = "data:image/png;base64," + frames[i];
    out.textContent = labels[i];
  }});
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
                description=name, continuous_update=True, layout=widgets.Layout(width="70%"),
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


def _as_float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _closest_index(values, target) -> int:
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


def interactive_figure(draw: Callable, caption: str, *, defaults: dict | None = None, figsize=(6.4, 3.6),
                       dpi: int = 72, max_frames: int = 30, max_bytes: int = 1_500_000, show: bool = True,
                       **sliders) -> InteractiveFigure:
    """Build an :class:`InteractiveFigure` from ``draw(fig, **values)`` and slider ``name=values``; show it."""
    figure = InteractiveFigure(draw, sliders, caption, defaults=defaults, figsize=figsize, dpi=dpi,
                               max_frames=max_frames, max_bytes=max_bytes)
    if show:
        figure.show()
    return figure
