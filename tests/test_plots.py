"""The report charts (``sapiens2.eval.plots``, matplotlib): each shows exactly the numbers it is given (bar lengths,
bar heights, lines and the values written on them), renders to the documented picture size, and without matplotlib
says which extra to install."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sapiens2.eval.plots import bar_chart, grouped_bar_chart, histogram_chart, line_panels, pixels


def test_bar_chart_draws_each_value_and_writes_it():
    names = ["Background", "Hair", "Face_Neck", "Torso"]
    values = [67.84, 120.0, float("nan"), 3.05]
    figure = bar_chart(names, values, "per-class IoU (%)")
    axes = figure.axes[0]
    lengths = [patch.get_width() for patch in axes.patches]
    np.testing.assert_allclose(lengths, [67.84, 100.0, 0.0, 3.05])  # cut at the maximum; NaN draws nothing
    assert [text.get_text() for text in axes.texts] == ["67.8", "120.0", "n/a", "3.0"]
    assert [label.get_text() for label in axes.get_yticklabels()] == names
    assert [label.get_text() for label in axes.get_xticklabels()] == ["0%", "25%", "50%", "75%", "100%"]
    picture = pixels(figure)
    assert picture.shape == (80 + 20 * 4, 760, 3) and picture.dtype == np.uint8
    assert (picture < 128).any() and (picture == 255).all(-1).mean() > 0.5  # ink on a white page
    with pytest.raises(ValueError, match="2 names for 1 values"):
        bar_chart(["a", "b"], [1.0], "t")


def test_histogram_chart_shows_percentages_and_folds_the_tail_into_the_last_bar():
    counts = np.array([10, 30, 40, 15, 5])
    figure = histogram_chart(counts, 2.0, "error", x_label="degrees", marks=(3.0, 99.0), x_max=6.0)
    axes = figure.axes[0]
    heights = [patch.get_height() for patch in axes.patches]
    np.testing.assert_allclose(heights, [10.0, 30.0, 60.0])  # bins 3 and 4 summed into the last bar drawn (x < 6)
    np.testing.assert_allclose([patch.get_x() for patch in axes.patches], [0.0, 2.0, 4.0])
    assert axes.get_xlim() == (0.0, 6.0)
    assert [line.get_xdata()[0] for line in axes.lines] == [3.0]  # the mark inside the range only
    assert pixels(figure).shape == (360, 760, 3)


def test_grouped_bars_show_every_series_and_label_the_first():
    series = {"AP": [0.72, float("nan")], "AP50": [0.91, float("nan")], "AP75": [0.8, float("nan")]}
    figure = grouped_bar_chart(["body", "face"], series, "OKS AP")
    axes = figure.axes[0]
    heights = np.array([patch.get_height() for patch in axes.patches]).reshape(3, 2)  # per series, per group
    np.testing.assert_allclose(heights, [[0.72, 0.0], [0.91, 0.0], [0.8, 0.0]])
    assert [text.get_text() for text in axes.texts] == ["0.720", "n/a"]
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["AP", "AP50", "AP75"]
    assert pixels(figure).shape == (420, 120 + 2 * 110, 3)


def test_line_panels_plot_the_values_given_with_gaps_where_nan():
    times = np.arange(5) / 10
    left, right = np.array([1.0, 2.0, np.nan, 4.0, 5.0]), np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    figure = line_panels(times, [("knee", [("left", left), ("right", right)]), ("hip", [("left", right)])], "angles")
    first, second = figure.axes
    np.testing.assert_array_equal(first.lines[0].get_ydata(), left)  # NaN kept: matplotlib breaks the line there
    np.testing.assert_array_equal(first.lines[1].get_ydata(), right)
    np.testing.assert_array_equal(first.lines[0].get_xdata(), times)
    assert first.get_title(loc="left") == "knee" and len(second.lines) == 1
    assert pixels(figure).shape == (80 + 150 * 2, 900, 3)


def test_without_matplotlib_a_chart_names_the_extra():
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # as if not installed: importing it fails
        "from sapiens2.eval.plots import bar_chart\n"
        "try:\n    bar_chart(['a'], [1.0], 't')\nexcept ImportError as error:\n    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "charts need matplotlib: pip install 'sapiens2[plots]'"
