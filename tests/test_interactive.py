"""The figure helper: one draw function, a live widget and a static slider, with bounds."""

import json
import math
import re
import time

import pytest

from posenc.lab import figure_images, interactive


def draw(fig, scale, offset=0.0):
    ax = fig.subplots()
    ax.plot([0, 1, 2], [offset, scale + offset, 2 * scale + offset])
    ax.set_ylim(-5, 25)


def make(**options):
    return interactive.InteractiveFigure(
        draw, {"scale": range(10), "offset": [0.0, 0.5, 1.0]}, "a line", figsize=(3, 2), **options
    )


@pytest.fixture(autouse=True)
def inline_images(monkeypatch):
    """Static images as data URIs unless a test asks for files."""
    monkeypatch.setenv("POSENC_FRAMES_DIR", "")


def frames_of(page: str) -> list:
    return json.loads(re.search(r"var frames = (\[.*?\]);", page).group(1))


def test_static_figure_is_one_image_with_joint_sliders():
    page = make().static_html()
    assert page.count('<input type="range"') == 2 and page.count("<figcaption>") == 1 and page.count("<img") == 1
    frames = frames_of(page)
    assert len(frames) == 10 * 3 and len(set(frames)) == 30  # the product of the values, each a different picture
    assert json.loads(re.search(r"var labels = (\[.*?\]);", page).group(1)) == [
        [str(v) for v in range(10)],
        ["0", "0.5", "1"],
    ]
    # the default frame (scale 5, offset 0.5) is flat index 5 * 3 + 1 of the grid, the last slider fastest
    shown = re.search(r'<img class="posenc-img" src="([^"]+)" alt="a line \(scale = 5, offset = 0.5\)"', page)
    assert shown and shown.group(1) == frames[5 * 3 + 1]
    assert "http" not in page  # nothing to fetch


def test_static_images_are_2x_and_record_their_text_size():
    def labelled(fig, scale):
        ax = fig.subplots()
        ax.plot([0, scale])
        ax.set_title("title", fontsize=12)
        ax.tick_params(labelsize=8)

    page = interactive.InteractiveFigure(labelled, {"scale": [1, 2]}, "c", figsize=(3, 2)).static_html()
    width, height = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"', page).groups())
    assert width == interactive.STATIC_WIDTH_PX and abs(height - width * 2 / 3) <= 1
    assert 'data-min-font-pt="8"' in page and 'data-fig-width-in="3"' in page


def test_smallest_font_ignores_hidden_axes_and_empty_texts():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    shown, hidden = fig.subplots(1, 2)
    shown.set_title("title", fontsize=12)
    shown.tick_params(labelsize=10)
    hidden.tick_params(labelsize=5)
    hidden.axis("off")
    fig.text(0.5, 0.5, "", fontsize=3)
    assert figure_images.render_static(fig).min_font_pt == 10  # read after the draw that gives tick labels text
    hidden.axis("on")
    assert figure_images.render_static(fig).min_font_pt == 5


def test_joint_frames_are_subsampled_to_the_budget_and_keep_the_ends():
    figure = interactive.InteractiveFigure(
        draw, {"scale": range(30), "offset": [0.0, 0.5, 1.0, 1.5, 2.0]}, "a line", figsize=(3, 2), max_total_frames=40
    )
    grid = figure.frame_values()
    assert math.prod(len(v) for v in grid.values()) <= 40
    assert grid["offset"] == [0.0, 0.5, 1.0, 1.5, 2.0] and len(grid["scale"]) == 8  # the largest count shrinks
    assert grid["scale"][0] == 0 and grid["scale"][-1] == 29
    single = interactive.InteractiveFigure(draw, {"scale": range(100)}, "a line", figsize=(3, 2), max_frames=7)
    assert single.frame_values()["scale"] == [round(i * 99 / 6) for i in range(7)]
    grid, images = single.frames()
    values = grid["scale"]
    assert values[0] == 0 and values[-1] == 99 and len(values) == len(images) == 7


def test_frames_are_files_when_a_frames_directory_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv("POSENC_FRAMES_DIR", str(tmp_path))
    monkeypatch.setenv("POSENC_FRAMES_URL", "../_static/frames/")
    page = make().static_html()
    frames = frames_of(page)
    assert all(re.fullmatch(r"\.\./_static/frames/[0-9a-f]{20}\.png", url) for url in frames)
    files = sorted(tmp_path.iterdir())
    assert len(files) == 30 and all(f.read_bytes().startswith(b"\x89PNG") for f in files)
    assert "base64" not in page
    make().static_html()  # the same pictures again: the same files, nothing new
    assert sorted(tmp_path.iterdir()) == files


def test_book_tools_get_files_by_default(monkeypatch):
    monkeypatch.delenv("POSENC_FRAMES_DIR")
    monkeypatch.setenv("POSENC_FIGURES", "static")
    assert interactive.frames_dir().endswith("_build/frames")  # inside the book's checkout
    monkeypatch.setenv("POSENC_FIGURES", "live")
    assert interactive.frames_dir() is None


def test_static_frames_share_the_default_frames_layout(monkeypatch):
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    runs = []
    execute = ConstrainedLayoutEngine.execute
    monkeypatch.setattr(ConstrainedLayoutEngine, "execute", lambda self, fig: (runs.append(1), execute(self, fig))[1])
    figure = interactive.InteractiveFigure(
        colorbar_draw, {"scale": range(6), "offset": [0.0, 1.0]}, "c", figsize=(4, 2)
    )
    grid, images = figure.frames()
    assert len(images) == 12 and len(runs) == 1  # laid out once, on the default frame
    figure.update().canvas.draw()  # a fresh layout of the default frame
    expected = [v for ax in figure.figure.axes for v in ax.get_position().bounds]
    figure.frames()
    assert [v for ax in figure.figure.axes for v in ax.get_position().bounds] == pytest.approx(expected, abs=1e-6)


def test_page_weight_bound_is_enforced():
    with pytest.raises(ValueError, match="max_bytes"):
        make(max_bytes=1000).static_html()


def test_show_figure_is_2x_and_described(monkeypatch):
    from matplotlib.figure import Figure

    shown = []
    monkeypatch.setattr("IPython.display.display", shown.append)
    fig = Figure(figsize=(5, 2))
    fig.subplots().plot([0, 1])
    interactive.show_figure(fig, "a caption")
    page = shown[0].data
    assert f'width="{interactive.STATIC_WIDTH_PX}"' in page and 'data-fig-width-in="5"' in page
    assert 'alt="a caption"' in page and "<figcaption>a caption</figcaption>" in page


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


def test_redraw_is_timed_over_the_sliders_range(monkeypatch):
    """Each timed update really redraws the figure for the planned values, on the frozen layout; a draw that
    sleeps a known time shows up in the wall time and not in the CPU time."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    pause = 0.05
    drawn = []

    def slow(fig, scale, offset=0.0):
        time.sleep(pause)
        drawn.append(scale)
        draw(fig, scale, offset)

    figure = interactive.InteractiveFigure(
        slow, {"scale": range(10), "offset": [0.0, 0.5, 1.0]}, "a line", figsize=(3, 2)
    )
    layouts = []
    execute = ConstrainedLayoutEngine.execute
    monkeypatch.setattr(
        ConstrainedLayoutEngine, "execute", lambda self, fig: (layouts.append(1), execute(self, fig))[1]
    )
    wall, cpu = figure.redraw_times(repeats=6, cpu=True)
    assert len(wall) == len(cpu) == 6
    assert len(drawn) == 7 and len(layouts) == 1  # one untimed update laid out; the 6 timed ones reused it
    assert {0, 9} <= set(drawn)  # the walk reaches both ends of a slider
    assert all(t >= pause for t in wall)  # every timed update ran the draw
    assert all(c <= t - 0.8 * pause for c, t in zip(cpu, wall))  # sleeping takes no CPU
    plan = interactive._slider_walk(figure.sliders, 6)
    last = {**figure.defaults, **plan[-1]}
    assert figure.figure.axes[0].lines[0].get_ydata().tolist()[1] == last["scale"] + last["offset"]
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

    figure = interactive.InteractiveFigure(
        colorbar_draw, {"scale": range(10), "offset": [0.0, 1.0]}, "c", figsize=(4, 2)
    )
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


def lines_draw(fig, scale, in_place=False):
    """Two panels of lines with a legend and titles; with ``in_place`` it updates the figure it built before."""
    if not (in_place and fig.axes):
        left, right = fig.subplots(1, 2)
        for i in range(3):
            left.plot(range(5), [0] * 5)
            right.plot(range(5), [0] * 5, label=f"line {i}")
        right.legend()
    left, right = fig.axes
    for i, (a, b) in enumerate(zip(left.lines, right.lines)):
        a.set_ydata([scale * i * t for t in range(5)])
        b.set_ydata([scale * (t - i) ** 2 for t in range(5)])
    for ax, name in ((left, "linear"), (right, "square")):
        ax.set_title(f"{name}, scale {scale}")
        ax.relim()
        ax.autoscale_view()


def test_keep_axes_updates_in_place_and_draws_what_a_fresh_figure_draws():
    sliders = {"scale": [1, 2, 5, 10]}
    kept = interactive.InteractiveFigure(
        lambda fig, scale: lines_draw(fig, scale, in_place=True), sliders, "c", figsize=(4, 2), keep_axes=True
    )
    fresh = interactive.InteractiveFigure(lines_draw, sliders, "c", figsize=(4, 2))
    kept.live_png(scale=2)
    fresh.live_png(scale=2)
    axes = list(kept.figure.axes)
    for scale in (10, 1, 5, 2):
        assert kept.live_png(scale=scale) == fresh.live_png(scale=scale), scale
        assert kept.figure.axes == axes  # the same Axes objects: nothing was rebuilt
    grid, images = kept.frames()
    assert [i.src for i in images] == [i.src for i in fresh.frames()[1]]
    # frames() lays out its own default frame (scale 5): the live figure after it is built again on its own layout
    assert kept.live_png(scale=1) == fresh.live_png(scale=1)
    kept.update(scale=10)  # a fresh static draw clears the figure; the next live redraw builds it again
    fresh.update(scale=10)
    assert kept.live_png(scale=2) == fresh.live_png(scale=2)
    assert kept.live_png(scale=10) == fresh.live_png(scale=10)


def test_keep_axes_refuses_a_draw_that_adds_axes_or_artists():
    figure = interactive.InteractiveFigure(draw, {"scale": [1, 2]}, "c", figsize=(3, 2), keep_axes=True)
    figure.live_png(scale=1)
    with pytest.raises(ValueError, match="keep_axes"):
        figure.live_png(scale=2)
    assert figure.live_png(scale=2).startswith(b"\x89PNG")  # the next redraw starts afresh

    def piling(fig, scale):
        if not fig.axes:
            fig.subplots().plot([0, scale])
        fig.axes[0].text(0, 0, f"scale {scale}")  # a new text on every call: it would pile up

    def rebuilding(fig, scale):
        fig.clear()
        fig.subplots().plot([0, scale])

    for bad in (piling, rebuilding):
        figure = interactive.InteractiveFigure(bad, {"scale": [1, 2]}, "c", figsize=(3, 2), keep_axes=True)
        figure.live_png(scale=1)
        with pytest.raises(ValueError, match="number of artists"):
            figure.live_png(scale=2)
    with pytest.raises(TypeError, match="keep_axes"):
        interactive.InteractiveFigure(draw, {"scale": [1, 2]}, "c", keep_axes="yes")


def test_redraw_log_records_every_shown_figure(monkeypatch, tmp_path):
    log = tmp_path / "redraws.jsonl"
    monkeypatch.setenv("POSENC_REDRAW_LOG", str(log))
    monkeypatch.setenv("POSENC_FIGURES", "live")
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: None)
    make().show()
    interactive.InteractiveFigure(colorbar_draw, {"scale": range(4)}, "second", figsize=(3, 2)).show()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["caption"] for r in records] == ["a line", "second"]
    assert all(len(r["times_ms"]) == 7 and r["median_ms"] <= r["max_ms"] and r["median_cpu_ms"] >= 0 for r in records)
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


def test_the_lab_finds_the_checkout_it_runs_from(monkeypatch):
    """posenc/lab/ sits two levels below the checkout: static frames and the model cache go to its _build/."""
    from pathlib import Path

    from posenc.lab import interactive as lab_interactive
    from posenc.lab import language_model

    root = Path(__file__).resolve().parents[1]
    monkeypatch.delenv(lab_interactive.FRAMES_DIR_ENV, raising=False)
    monkeypatch.setenv("POSENC_FIGURES", "static")
    assert lab_interactive.frames_dir() == str(root / "_build" / "frames")
    monkeypatch.delenv(language_model.CACHE_ENV, raising=False)
    assert language_model.default_cache_dir() == root / "_build" / "cache"


def test_a_label_slider_starts_at_its_default():
    """Slider values that are labels (not numbers) start at the default label, not at the first value."""
    from posenc.lab.interactive import _closest_index

    assert _closest_index(["NoPE", "RoPE", "PaTH"], "PaTH") == 2
    assert _closest_index([0.0, 0.5, 1.0], 0.6) == 1  # numbers: the closest
    assert _closest_index([1, 2, 3], 2) == 1


def test_options_and_sliders_of_interactive_figure():
    """interactive_figure: a keyword named as an InteractiveFigure option is that option (colors included), any
    other keyword a slider; the book's helpers stay importable from interactive."""

    def draw(fig, scale, offset):
        fig.subplots().plot([0, 1], [offset, scale])

    figure = interactive.interactive_figure(
        draw, "a line", show=False, defaults={"scale": 2}, colors=16, dpi=50, scale=range(4), offset=[0.0, 1.0]
    )
    assert set(figure.sliders) == {"scale", "offset"} and figure.defaults == {"scale": 2, "offset": 1.0}
    assert (figure.colors, figure.dpi) == (16, 50)
    assert set(interactive.FIGURE_OPTIONS) >= {"defaults", "figsize", "dpi", "colors", "keep_axes", "max_bytes"}
    assert interactive.show_figure is figure_images.show_figure and interactive.frames_dir is figure_images.frames_dir
