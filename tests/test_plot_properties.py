"""Properties of the figures: unclipped bars, plain ticks, labels that do not overlap, sorted breakdowns."""

import numpy as np
import pandas as pd
import pytest

from plexus_tune.report import figures as plotting


def crowded_frame(n=14, seed=3):
    """Grids whose points crowd together (predicted and observed within a few percent)."""
    rng = np.random.default_rng(seed)
    pred = 100 + np.sort(rng.uniform(0, 12, n))
    obs = pred * 1.6 + rng.uniform(-3, 3, n)  # a constant offset: R^2 says little, the median ratio does
    grids = [f"{a}x{b}x{c}" for a, b, c in rng.integers(1, 64, (n, 3))]
    return pd.DataFrame({"grid": grids, "pred_total_ms": pred, "obs_epoch_ms": obs, "pred_feasible": True})


def _boxes_intersect(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_pred_vs_obs_labels_overlap_neither_each_other_nor_markers():
    frame = crowded_frame()
    fig = plotting.plot_pred_vs_obs(frame)
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in ax.texts if t.get_text() in set(frame["grid"])]
    assert len(texts) == len(frame)
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not _boxes_intersect(boxes[i], boxes[j]), (texts[i].get_text(), texts[j].get_text())
    # markers: every scatter point with its marker size (the star and the ring are larger)
    for coll in ax.collections:
        offsets = coll.get_offsets()
        sizes = coll.get_sizes()
        if len(offsets) == 0 or len(sizes) == 0:
            continue
        xy = ax.transData.transform(offsets)
        half = np.sqrt(np.resize(sizes, len(xy))) / 2 * fig.dpi / 72.0
        for (px, py), h in zip(xy, half):
            for box in boxes:
                assert not (box.x0 < px + h and px - h < box.x1 and box.y0 < py + h and py - h < box.y1)


def test_pred_vs_obs_legend_gives_mape_and_median_ratio():
    frame = crowded_frame()
    fig = plotting.plot_pred_vs_obs(frame)
    text = " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    ratio = np.median(frame["obs_epoch_ms"] / frame["pred_total_ms"])
    mape = 100 * np.mean(np.abs(frame["pred_total_ms"] - frame["obs_epoch_ms"]) / frame["obs_epoch_ms"])
    assert f"median obs/pred {ratio:.2f}" in text and f"MAPE {mape:.1f} %" in text and "R$^2$" in text


def test_predicted_breakdown_does_not_clip_its_tallest_bar_and_shows_overhead():
    frame = pd.DataFrame({"grid": ["a", "b", "c"], "pred_spmm_ms": [10.0, 300.0, 20.0], "pred_gemm_ms": [1.0, 2.0, 3.0],
                          "pred_comm_x_ms": [5.0, 5.0, 5.0], "pred_other_ms": [1.0, 1.0, 1.0],
                          "pred_overhead_ms": [40.0, 40.0, 40.0]})
    fig = plotting.plot_breakdown(frame, observed=False)
    ax = fig.axes[0]
    fig.canvas.draw()
    top = max(p.get_y() + p.get_height() for p in ax.patches)
    assert top == pytest.approx(348.0)
    assert ax.get_ylim()[1] >= top
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("overhead") for label in labels)
    # sorted by time: the predicted totals increase from left to right
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "c", "b"]


def test_observed_breakdown_is_sorted_by_time_and_marks_the_epoch():
    frame = pd.DataFrame({"grid": ["z", "a", "m"], "obs_epoch_ms": [50.0, 90.0, 20.0], "pred_total_ms": [40.0, 60.0, 30.0],
                          "obs_spmm_ms": [20.0, 40.0, 5.0], "obs_wait_ms": [30.0, 50.0, 15.0],
                          "pred_spmm_ms": [40.0, 60.0, 30.0]})
    fig = plotting.plot_breakdown(frame)
    ax = fig.axes[0]
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["m", "z", "a"]
    marker = [c for c in ax.collections if c.get_label() == "observed epoch"]
    assert len(marker) == 1
    ys = sorted(seg[0][1] for seg in marker[0].get_segments())
    assert ys == [20.0, 50.0, 90.0]
    assert ax.get_ylim()[1] >= 90.0


def test_scaling_plot_uses_plain_ms_ticks():
    pred = pd.DataFrame({"dataset": ["d"] * 5, "gpus": [8, 16, 32, 64, 128],
                         "pred_total_ms": [95.0, 70.0, 61.0, 58.0, 64.0]})
    fig = plotting.plot_strong_scaling(pred)
    ax = fig.axes[0]
    fig.canvas.draw()
    texts = [t.get_text() for t in ax.get_yticklabels(which="both") if t.get_text()]
    assert texts, "no y tick labels"
    for text in texts:
        assert "10^" not in text and "times" not in text and "$" not in text
        float(text)  # a plain number
    assert "60" in texts


def test_history_range_is_not_set_by_infeasible_trials():
    trials = pd.DataFrame({"number": range(8), "state": "COMPLETE",
                           "value": [10.0, 9.0, 5000.0, 8.5, 8.0, 9000.0, 7.5, 7.0],
                           "feasible": [True, True, False, True, True, False, True, True]})
    fig = plotting.plot_search_history(trials)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert lo <= 7.0 and hi >= 10.0  # every feasible trial shown
    assert hi < 100.0  # not stretched to the infeasible 9000
    assert ax.get_yscale() == "linear"


def test_breakdown_legend_lists_only_parts_with_height_and_names_the_x_axis():
    frame = pd.DataFrame({"grid": ["a", "b"], "pred_spmm_ms": [10.0, 20.0], "pred_gemm_ms": [0.0, 0.0],
                          "pred_comm_x_ms": [5.0, 0.0], "pred_quant_ms": [0.0, 0.0]})
    ax = plotting.plot_breakdown(frame, observed=False).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    parts = {label.split(" (")[0] for label in labels}
    assert any(p.startswith("SpMM") or p.lower().startswith("spmm") for p in parts), labels
    assert not any(p.lower().startswith(("gemm", "quant")) for p in parts), labels
    assert len(labels) == 2, labels
    assert ax.get_xlabel() == "grid Gx x Gy x Gz"


def test_pred_vs_obs_holds_every_error_bar():
    frame = crowded_frame(n=5).assign(obs_epoch_ms_std=[1.0, 1.0, 1.0, 1.0, 80.0])
    ax = plotting.plot_pred_vs_obs(frame).axes[0]
    top = float((frame["obs_epoch_ms"] + frame["obs_epoch_ms_std"]).max())
    bottom = float((frame["obs_epoch_ms"] - frame["obs_epoch_ms_std"]).min())
    assert ax.get_ylim()[1] >= top and ax.get_ylim()[0] <= bottom
