"""The plots draw the same line from fewer points: one a chart column, and a flat run by its ends."""

from __future__ import annotations

from widgets.plots import per_column


def test_a_flat_run_keeps_only_its_ends_and_every_change() -> None:
    xs = [float(x) for x in range(-10, 0)]
    ys = [0, 0, 0, 0, 5, 5, 5, 7, 7, 7]
    assert per_column(xs, ys, horizon_s=300, columns=90) == (
        [-10.0, -7.0, -6.0, -4.0, -3.0, -1.0], [0, 0, 5, 5, 7, 7])


def test_a_line_that_never_repeats_is_left_as_it_is() -> None:
    xs, ys = [-3.0, -2.0, -1.0], [1.0, 2.0, 1.0]
    assert per_column(xs, ys, horizon_s=300, columns=90) == (xs, ys)


def test_more_points_than_columns_become_the_mean_of_each_column() -> None:
    # 300 s on 100 columns: 3 s a column; one point a second, rising by one each second
    xs = [float(x) for x in range(-300, 0)]
    ys = [float(i) for i in range(300)]
    out_x, out_y = per_column(xs, ys, horizon_s=300, columns=100)
    assert len(out_x) == 100
    assert out_x[:2] == [-299.0, -296.0] and out_y[:2] == [1.0, 4.0]  # means of 3 points each
    assert out_y[-1] == 298.0
