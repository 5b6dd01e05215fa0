"""The figure helper: one draw function, a live widget and a static slider, with bounds."""
import json
import re

import pytest

from posenc import interactive


def draw(fig, scale, offset=0.0):
    ax = fig.subplots()
    ax.plot([0, 1, 2], [offset, scale + offset, 2 * scale + offset])
    ax.set_ylim(-5, 25)


def make(**options):
    return interactive.InteractiveFigure(draw, {"scale": range(10), "offset": [0.0, 0.5, 1.0]}, "a line",
                                         figsize=(3, 2), **options)


def test_static_slider_has_one_frame_per_value_and_alt_text():
    page = make().static_html()
    assert page.count('<input type="range"') == 2 and page.count("<figcaption>") == 2
    frames = [json.loads(m) for m in re.findall(r"var frames = (\[.*?\]);", page)]
    assert [len(f) for f in frames] == [10, 3]
    assert len(set(frames[0])) == 10  # every value draws a different picture
    assert re.search(r'<img src="data:image/png;base64,[^"]+" alt="a line \(slider: scale; offset = 0.5\)"', page)
    assert "http" not in page  # nothing to fetch


def test_frames_are_subsampled_to_the_bound_and_keep_the_ends():
    figure = interactive.InteractiveFigure(draw, {"scale": range(100)}, "a line", figsize=(3, 2), max_frames=7)
    values, images = figure.frames("scale")
    assert values[0] == 0 and values[-1] == 99 and len(values) == len(images) == 7


def test_page_weight_bound_is_enforced():
    with pytest.raises(ValueError, match="max_bytes"):
        make(max_bytes=1000).static_html()


def test_live_widget_redraws_on_slider_change():
    widget = make().widget()
    sliders, image = widget.children[:-1], widget.children[-1]
    assert [s.description for s in sliders] == ["scale", "offset"]
    assert bytes(image.value).startswith(b"\x89PNG")
    before = make().update(scale=1).axes[0].lines[0].get_ydata().tolist()
    figure = make()
    box = figure.widget()
    first_picture = bytes(box.children[-1].value)
    box.children[0].value = 9
    assert bytes(box.children[-1].value) != first_picture
    assert figure.figure.axes[0].lines[0].get_ydata().tolist() != before
    assert figure.figure.axes[0].lines[0].get_ydata().tolist()[1] == 9.5


def test_mode_follows_the_environment(monkeypatch):
    monkeypatch.setenv("POSENC_FIGURES", "static")
    assert interactive.figure_mode() == "static"
    monkeypatch.setenv("POSENC_FIGURES", "live")
    assert interactive.figure_mode() == "live"
    monkeypatch.delenv("POSENC_FIGURES")
    assert interactive.figure_mode() == "static"  # no kernel in pytest


def test_redraw_is_timed_over_the_sliders_range():
    figure = make()
    drawn = []
    original = figure.draw
    figure.draw = lambda fig, **values: (drawn.append(values), original(fig, **values))[1]
    wall, cpu = figure.redraw_times(repeats=6, cpu=True)
    assert len(wall) == len(cpu) == 6 and all(t > 0 for t in wall) and all(t >= 0 for t in cpu)
    scales = {v["scale"] for v in drawn}
    assert {0, 9} <= scales  # the walk reaches both ends of a slider
    assert figure.redraw_seconds(repeats=3) == pytest.approx(figure.redraw_seconds(repeats=3), rel=10)
    with pytest.raises(ValueError, match="repeats"):
        figure.redraw_times(repeats=0)


def colorbar_draw(fig, scale, offset=0.0):
    left, right = fig.subplots(1, 2)
    left.plot([0, 1, 2], [offset, scale, 2 * scale])
    left.set_title(f"scale {scale}")
    image = right.imshow([[scale, offset], [1.0, 2.0]], vmin=0, vmax=10)
    fig.colorbar(image, ax=right)


def test_live_frames_reuse_the_first_layout(monkeypatch):
    """Constrained layout runs once; later live frames put the axes where it put them, colour bar included."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    figure = interactive.InteractiveFigure(colorbar_draw, {"scale": range(10), "offset": [0.0, 1.0]}, "c",
                                           figsize=(4, 2))
    runs = []
    execute = ConstrainedLayoutEngine.execute
    monkeypatch.setattr(ConstrainedLayoutEngine, "execute", lambda self, fig: (runs.append(1), execute(self, fig))[1])
    first = figure.live_png(scale=3)
    assert first.startswith(b"\x89PNG") and len(runs) == 1
    laid_out = [v for ax in figure.figure.axes for v in ax.get_position().bounds]
    assert len(laid_out) == 3 * 4
    for scale in (0, 7, 9):
        figure.live_png(scale=scale)
    assert len(runs) == 1
    assert [v for ax in figure.figure.axes for v in ax.get_position().bounds] == pytest.approx(laid_out)
    # the static (web) frame is laid out afresh, and lands where the live frame's layout was computed
    figure.update(scale=3).canvas.draw()
    assert len(runs) == 2
    assert [v for ax in figure.figure.axes for v in ax.get_position().bounds] == pytest.approx(laid_out, abs=1e-6)


def test_a_figure_whose_axes_change_is_laid_out_again():
    def draw(fig, panels):
        for i, ax in enumerate(fig.subplots(1, panels, squeeze=False)[0]):
            ax.plot([0, i])

    figure = interactive.InteractiveFigure(draw, {"panels": [1, 2, 3]}, "c", figsize=(4, 2))
    widths = {}
    for panels in (1, 3, 2, 1):
        figure.live_png(panels=panels)
        widths[panels] = [round(ax.get_position().width, 3) for ax in figure.figure.axes]
        assert len(widths[panels]) == panels
    assert widths[1][0] > 2 * widths[3][0]


def test_a_figure_laid_out_by_hand_keeps_its_layout():
    def draw(fig, scale):
        fig.set_layout_engine(None)
        ax = fig.subplots()
        fig.subplots_adjust(0.2, 0.2, 0.9, 0.9)
        ax.plot([0, scale])

    figure = interactive.InteractiveFigure(draw, {"scale": [1, 2, 3]}, "c", figsize=(3, 2))
    for scale in (1, 3, 2):
        assert figure.live_png(scale=scale).startswith(b"\x89PNG")
        assert figure.figure.axes[0].get_position().bounds == pytest.approx((0.2, 0.2, 0.7, 0.7))


def test_redraw_log_records_every_shown_figure(monkeypatch, tmp_path):
    log = tmp_path / "redraws.jsonl"
    monkeypatch.setenv("POSENC_REDRAW_LOG", str(log))
    monkeypatch.setenv("POSENC_FIGURES", "live")
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: None)
    make().show()
    interactive.InteractiveFigure(colorbar_draw, {"scale": range(4)}, "second", figsize=(3, 2)).show()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["caption"] for r in records] == ["a line", "second"]
    assert all(len(r["times_ms"]) == 7 and r["median_ms"] <= r["max_ms"] and r["median_cpu_ms"] >= 0
               for r in records)
    assert [r["axes"] for r in records] == [1, 3]


def test_bad_input():
    with pytest.raises(ValueError, match="caption"):
        interactive.InteractiveFigure(draw, {"scale": [1, 2]}, "")
    with pytest.raises(ValueError, match="two values"):
        interactive.InteractiveFigure(draw, {"scale": [1]}, "c")
    with pytest.raises(ValueError, match="not a slider"):
        interactive.InteractiveFigure(draw, {"scale": [1, 2]}, "c", defaults={"size": 1})
    with pytest.raises(ValueError, match="unknown slider"):
        make().update(size=3)
    with pytest.raises(TypeError, match="draw"):
        interactive.InteractiveFigure(None, {"scale": [1, 2]}, "c")
