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


def test_redraw_is_timed():
    assert 0 < make().redraw_seconds(repeats=3) < 5


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
