"""The A/B plot (ab.png): step time per step per arm, and the first call's extra over a regular one.

The table gives medians; the plot shows what medians hide: a drift across the run (the repeated
arms exist to catch it), a warm-up step that is not over, or a first call that pays for something
the others do not (what staging the next first micro-batch is meant to remove). matplotlib is an
optional extra: without it the report says the plot was skipped and why.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from rl_trainer_bench.bench.step_record import ArmRun
from rl_trainer_bench.io import write_atomically


def missing_reason() -> str | None:
    """Why no plot can be drawn here, or None when matplotlib is importable."""
    try:  # matplotlib: optional (the [plot] extra); the report is written without it
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (install the [plot] extra for ab.png)"
    return None


def write_plot(runs: Sequence[ArmRun], path: Path, title: str) -> None:
    """Draw both panels and write the PNG atomically.

    The x axis is the run itself: every step of every arm in the order it ran, one colour per
    setting, so a drift across the run, the blocks of a long A/B and a setting's repeats read at a
    glance however many arms there are (a legend per arm stops being readable past a handful).
    """
    import matplotlib  # optional (the [plot] extra): the report is written without it

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # after the backend is chosen: pyplot reads it on import

    figure, (steps_axis, first_axis) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    colours = {}
    start = 0
    for run in runs:
        index = list(range(start, start + len(run.records)))
        start += len(run.records)
        step_ms = [r.step_s * 1e3 for r in run.records]
        extra_ms = [
            float("nan") if r.first_call_extra_s is None else r.first_call_extra_s * 1e3
            for r in run.records
        ]
        label = None if run.setting in colours else run.setting
        colour = colours.setdefault(run.setting, f"C{len(colours) % 10}")
        steps_axis.plot(index, step_ms, marker="o", markersize=3, color=colour, label=label)
        first_axis.plot(index, extra_ms, marker="o", markersize=3, color=colour)
        warm = [i for i, r in zip(index, run.records, strict=True) if r.warmup]
        steps_axis.plot(
            warm,
            [step_ms[i - index[0]] for i in warm],
            "o",
            mfc="none",
            color=colour,
            markersize=8,
        )
    steps_axis.set_ylabel("step time (ms)")
    steps_axis.set_title(textwrap.fill(title, 100), fontsize=9)
    steps_axis.legend(title="setting (circled: warm-up, not scored)", fontsize=8)
    first_axis.set_ylabel("first call's extra (ms)")
    first_axis.set_xlabel("step, in the order the arms ran")
    for axis in (steps_axis, first_axis):
        axis.grid(alpha=0.3)
    warm_max = max((r.step_s for run in runs for r in run.records if r.warmup), default=0.0)
    scored_max = max(r.step_s for run in runs for r in run.scored)
    if warm_max > 5 * scored_max:  # keep the scored steps readable; the warm-up runs off the top
        steps_axis.set_ylim(0, 1.5 * scored_max * 1e3)
    figure.tight_layout()
    try:
        write_atomically(path, lambda handle: figure.savefig(handle, format="png", dpi=110))
    finally:
        plt.close(figure)
