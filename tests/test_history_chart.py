"""The history page's trend charts and what the page prints (issue 35 point 6): runs of one commit
told apart on x, every commit labelled, change-point labels never on each other, a slow variant
that cannot squash a fast one's step flat, and no folder of the machine that made the page."""

from __future__ import annotations

import hashlib

from matplotlib.backends.backend_agg import FigureCanvasAgg

from gpubench.gate.history.changepoints import CaseHistory, ChangePoint
from gpubench.gate.history.store import Point
from gpubench.reports import history_page
from gpubench.reports.trend_chart import trend_figure


def _points(values, commits, variant):
    return tuple(
        Point(
            f"run{i:02d}",
            "ci-1",
            commits[i],
            "main",
            False,
            f"2026-12-01T00:{i:02d}:00+00:00",
            float(v),
            float(v) * 0.99,
            float(v) * 1.01,
            30,
            "/r.json",
            variant,
            "complete",
        )
        for i, v in enumerate(values)
    )


def _change(points, index, magnitude):
    return ChangePoint(
        index,
        points[index].run_id,
        points[index].commit,
        points[index].started_at,
        1e-5,
        1.0,
        1.0 + magnitude,
        magnitude,
        None,
        None,
        "regression" if magnitude > 0 else "improvement",
    )


def _history(variant, values, commits, changes=()):
    points = _points(values, commits, variant)
    return CaseHistory(
        "NVIDIA H100", "t[n=1]", variant, "time", points, tuple(_change(points, i, m) for i, m in changes)
    )


COMMITS = [hashlib.sha1(f"commit {i}".encode()).hexdigest() for i in range(20)]


def _draw(histories):
    runs = sorted({p.run_id: p for h in histories for p in h.points}.values(), key=lambda p: p.run_id)
    fig = trend_figure(histories, runs, {"fused": "optimized", "loop": "baseline"}, lambda c: None)
    FigureCanvasAgg(fig).draw()
    return fig


def test_runs_of_one_commit_get_labels_of_their_own():
    commits = [COMMITS[0]] * 3 + [COMMITS[1]] + [COMMITS[2]] * 2
    fig = _draw([_history("fused", [1e-3] * 6, commits)])
    labels = [t.get_text() for t in fig.axes[-1].get_xticklabels()]
    short = [c[:7] for c in COMMITS[:3]]
    assert labels == [
        f"{short[0]} #1",
        f"{short[0]} #2",
        f"{short[0]} #3",
        short[1],
        f"{short[2]} #1",
        f"{short[2]} #2",
    ]
    assert len(set(labels)) == len(labels)


def test_every_commit_of_twenty_runs_is_labelled():
    fig = _draw([_history("fused", [1e-3] * 20, COMMITS)])
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == [c[:7] for c in COMMITS]
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[-1].get_xticklabels()]
    assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))  # and readable: none on its neighbour


def test_change_point_labels_close_together_do_not_overlap():
    values = [1e-3] * 5 + [1.2e-3] + [1.0e-3] + [1.3e-3] * 13
    fig = _draw(
        [
            _history("fused", values, COMMITS, changes=[(5, 0.2), (6, -0.17), (7, 0.3)]),
            _history("loop", [2e-3] * 20, COMMITS, changes=[(6, 0.1)]),
        ]
    )
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]), [
            t.get_text() for t in ax.texts
        ]
    assert len(fig.axes[0].texts) == 3


def test_a_slow_variant_does_not_squash_a_fast_ones_step_flat():
    fast = [1e-3] * 10 + [1.1e-3] * 10  # a 10% step
    fig = _draw([_history("fused", fast, COMMITS, changes=[(10, 0.1)]), _history("loop", [0.1] * 20, COMMITS)])
    panel = next(ax for ax in fig.axes if ax.get_title(loc="left") == "fused")
    low, high = panel.get_ylim()
    unit = 1e-3 if "ms" in panel.get_ylabel() else 1e-6 if "us" in panel.get_ylabel() else 1.0
    assert (1.1e-3 - 1e-3) / unit / (high - low) > 0.3  # the step takes a good part of its panel's height
    assert len(fig.axes) == 2


def test_the_page_names_no_folder_of_the_machine_that_made_it(tmp_path):
    assert history_page.store_text(str(tmp_path / "deep" / "history.sqlite")) == "history.sqlite"
    assert (
        history_page.store_text("postgresql://ci:s3cret@db.example.org:5432/bench")
        == "postgresql://db.example.org:5432/bench"
    )
    assert history_page.remote_text("/work/main") == "main (a local folder)"
    assert history_page.remote_text("file:///srv/git/bench.git/") == "bench.git (a local folder)"
    assert history_page.remote_text("git@github.com:acme/bench.git") == "git@github.com:acme/bench.git"
    assert history_page.remote_text("https://tok:x@github.com/acme/bench") == "https://github.com/acme/bench"


def test_the_written_page_holds_no_absolute_path(tmp_path):
    from click.testing import CliRunner
    from test_history_page import write_step_history

    from gpubench.cli import main

    store = tmp_path / "somewhere" / "h.sqlite"
    store.parent.mkdir()
    write_step_history(store)
    origin = tmp_path / "origin-clone"
    out = tmp_path / "page.html"
    result = CliRunner().invoke(
        main, ["history", "html", "--store", str(store), "-o", str(out), "--remote", str(origin)]
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert str(tmp_path) not in text
    assert "<code>h.sqlite</code>" in text or "h.sqlite, branch" in text
    assert "origin-clone (a local folder)" in text
