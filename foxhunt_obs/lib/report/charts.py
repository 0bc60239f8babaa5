"""The weekly cost report's charts: PNG bytes from matplotlib's Agg canvas, no display, no pyplot.

Three charts share one set of series and one colour per series, so an experiment looks the same in each:
the biggest experiments by the week's $ (at most ``MAX_SERIES``), the rest lumped into "(other
experiments)", and "(cluster idle)" (GPUs no pod held) always grey and on top of the stacks.

Same input, same bytes: the style is matplotlib's defaults whatever the machine's matplotlibrc says, and
the PNG carries no Software/version text chunk (matplotlib writes no timestamp into PNGs).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from datetime import date, timedelta

import matplotlib as mpl
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from foxhunt_obs.lib.names import CLUSTER_IDLE, OTHER_EXPERIMENTS

MAX_SERIES = 10
SIZE_INCHES = (9.0, 4.0)
DPI = 100  # 900 x 400 px

IDLE_GREY = "#9e9e9e"
OTHER_COLOUR = "#4d4d4d"
# tab10 then tab20's light shades, without their greys (kept for the cluster-idle and "other" series)
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5",
)  # fmt: skip

_STYLE = {
    "text.parse_math": False,  # "$" in money labels and experiment names is text, not TeX
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
}


def chart_series(experiments: pd.DataFrame, max_series: int = MAX_SERIES) -> list[str]:
    """Series of the charts in stacking order: experiments by the week's allocated $ (largest first), then
    "(other experiments)" when some do not fit, then "(cluster idle)" when present."""
    if experiments.empty:
        return []
    spend = experiments.groupby("experiment", sort=True)["allocated_usd"].sum(min_count=1).fillna(0.0)
    named = spend.drop(CLUSTER_IDLE, errors="ignore")
    # sort by $ desc, ties by name, so the order does not depend on the frame's row order
    ranked = sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))
    keep = [name for name, _ in ranked]
    series = keep[:max_series] if len(keep) <= max_series else keep[: max_series - 1] + [OTHER_EXPERIMENTS]
    if CLUSTER_IDLE in spend.index:
        series.append(CLUSTER_IDLE)
    return series


def experiment_colours(series: Iterable[str]) -> dict[str, str]:
    """One colour per series: grey for the cluster idle, dark grey for the lump, the palette in name order
    for the rest (name order, not $ order, so a colour changes less from one week to the next)."""
    names = sorted({s for s in series if s not in (CLUSTER_IDLE, OTHER_EXPERIMENTS)})
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
    colours[CLUSTER_IDLE] = IDLE_GREY
    colours[OTHER_EXPERIMENTS] = OTHER_COLOUR
    return colours


def render_charts(daily: pd.DataFrame, experiments: pd.DataFrame, week_start: date) -> dict[str, bytes]:
    """The report's three charts, name.png -> PNG bytes."""
    series = chart_series(experiments)
    colours = experiment_colours(series)
    return {
        "daily_spend.png": daily_spend_png(daily, week_start, series, colours),
        "utilization_per_dollar.png": utilization_per_dollar_png(experiments, series, colours),
        "idle_by_day.png": idle_by_day_png(daily, week_start, series, colours),
    }


def daily_spend_png(daily: pd.DataFrame, week_start: date, series: Sequence[str], colours: dict) -> bytes:
    return _stacked_days_png(
        daily, "allocated_usd", week_start, series, colours, "Daily spend by experiment (allocated $)"
    )


def idle_by_day_png(daily: pd.DataFrame, week_start: date, series: Sequence[str], colours: dict) -> bytes:
    return _stacked_days_png(
        daily, "idle_usd", week_start, series, colours, "Idle $ by day (GPUs held but not busy, or unheld)"
    )


def utilization_per_dollar_png(experiments: pd.DataFrame, series: Sequence[str], colours: dict) -> bytes:
    """Horizontal bars: active GPU-hours per $ of each series (best on top), the week's overall ratio as a
    dashed line. Ratios are recomputed from sums so the "other" lump is a true aggregate."""
    with _style():
        fig, ax = _figure()
        sums = _lump(experiments, series).groupby("series")[["active_gpu_hours", "allocated_usd"]].sum()
        sums = sums[sums["allocated_usd"] > 0]
        if sums.empty:
            _no_data(ax, "Utilization per dollar")
            return _png(fig)
        ratio = (sums["active_gpu_hours"] / sums["allocated_usd"]).rename("ratio").reset_index()
        ratio = ratio.sort_values(["ratio", "series"], ascending=[True, False])  # barh draws bottom-up
        y = np.arange(len(ratio))
        ax.barh(y, ratio["ratio"], color=[colours[s] for s in ratio["series"]], height=0.65)
        ax.set_yticks(y, [_short(s) for s in ratio["series"]])
        top = float(ratio["ratio"].max())
        for yi, value in zip(y, ratio["ratio"]):
            ax.text(value + top * 0.01, yi, f"{value:,.3f}", va="center", fontsize=8.5)
        overall = sums["active_gpu_hours"].sum() / sums["allocated_usd"].sum()
        ax.axvline(overall, color="#333333", linestyle="--", linewidth=1, label=f"all GPUs: {overall:,.3f}")
        ax.set_xlim(0, max(top, overall) * 1.15 or 1.0)
        ax.set_xlabel("active GPU-hours per $ (higher is better)")
        ax.set_title("Utilization per dollar by experiment")
        ax.legend(loc="lower right")
        return _png(fig)


# -- helpers ----------------------------------------------------------------------------------------------
def _stacked_days_png(
    daily: pd.DataFrame, column: str, week_start: date, series: Sequence[str], colours: dict, title: str
) -> bytes:
    days = [week_start + timedelta(days=i) for i in range(7)]
    with _style():
        fig, ax = _figure()
        frame = _lump(daily, series)
        if frame.empty or not series:
            _no_data(ax, title)
            return _png(fig)
        frame = frame.assign(day=pd.to_datetime(frame["day"]).dt.date)
        table = frame.pivot_table(index="day", columns="series", values=column, aggfunc="sum", fill_value=0.0)
        table = table.reindex(index=days, columns=list(series), fill_value=0.0).fillna(0.0)
        x = np.arange(len(days))
        bottom = np.zeros(len(days))
        for name in series:
            values = table[name].to_numpy(dtype=float)
            ax.bar(x, values, bottom=bottom, width=0.7, color=colours[name], label=_short(name))
            bottom += values
        top = float(bottom.max())
        for xi, total in zip(x, bottom):
            if total > 0:
                ax.text(xi, total + top * 0.01, _money_label(total), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, [f"{d:%a}\n{d:%m-%d}" for d in days])
        ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _money_tick(v, top)))
        ax.set_title(title)
        # legend top-to-bottom in the same order as the stack
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return _png(fig)


def _lump(frame: pd.DataFrame, series: Sequence[str]) -> pd.DataFrame:
    """``frame`` with a ``series`` column: the experiment, or "(other experiments)" when not charted."""
    if frame.empty:
        return frame.assign(series=pd.Series(dtype=object))
    charted = set(series)
    names = frame["experiment"].astype(str)
    return frame.assign(series=names.where(names.isin(charted), OTHER_EXPERIMENTS))


@contextmanager
def _style():
    """matplotlib's default style plus ours, whatever the machine's matplotlibrc says."""
    with mpl.style.context("default"), mpl.rc_context(_STYLE):
        yield


def _figure():
    fig = Figure(figsize=SIZE_INCHES, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # metadata={"Software": None}: no matplotlib version in the file, so bytes only change with the data
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, facecolor="white")
    return buf.getvalue()


def _no_data(ax, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "no data for this week", ha="center", va="center", transform=ax.transAxes, fontsize=11)
    ax.set_axis_off()


def _short(name: str, width: int = 28) -> str:
    name = " ".join(str(name).split())
    return name if len(name) <= width else name[: width - 1] + "…"


def _money_tick(value: float, top: float) -> str:
    return f"${value:,.2f}" if top < 10 else f"${value:,.0f}"


def _money_label(value: float) -> str:
    if value >= 10_000:
        return f"${value / 1000:,.1f}k"
    return f"${value:,.0f}" if value >= 10 else f"${value:,.2f}"


__all__ = [
    "chart_series",
    "daily_spend_png",
    "experiment_colours",
    "idle_by_day_png",
    "render_charts",
    "utilization_per_dollar_png",
]
