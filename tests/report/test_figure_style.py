"""Figure axes stay legible at print size: log axes never label ticks on top of each other."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from suite.report.style import log_scale  # noqa: E402


def shown_labels(ax, axis: str):
    """The tick labels drawn on ``axis`` (major and minor), with their boxes."""
    ax.figure.canvas.draw()
    scale = ax.xaxis if axis == "x" else ax.yaxis
    renderer = ax.figure.canvas.get_renderer()
    low, high = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    labels = []
    for tick in [*scale.get_major_ticks(), *scale.get_minor_ticks()]:
        label = tick.label1
        if label.get_visible() and label.get_text() and low <= tick.get_loc() <= high:
            labels.append((label.get_text(), label.get_window_extent(renderer)))
    return labels


@pytest.mark.parametrize("axis", ["x", "y"])
@pytest.mark.parametrize("span", [(0.15, 0.9), (0.3, 20.0), (1e-3, 1e4)])
def test_log_axes_label_without_overlap(axis, span):
    fig, ax = plt.subplots(figsize=(3.25, 2.4))
    values = [span[0], (span[0] * span[1]) ** 0.5, span[1]]
    ax.plot(values, values)
    log_scale(ax, axis)
    labels = shown_labels(ax, axis)
    plt.close(fig)
    assert len(labels) >= 2, labels  # the reader can still read the scale
    boxes = [box for _, box in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), [text for text, _ in labels]
