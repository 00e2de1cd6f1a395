"""The figures, one function per plot kind of the registry (experiments/registry.py `plot["kind"]`)."""
from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
import numpy as np  # noqa: E402

from experiments.registry import WORKLOAD_TITLES  # noqa: E402

# one look per system across every figure
STYLE = {
    "cavs": ("tab:red", "o"), "cavs-serial": ("tab:pink", "v"), "dynet": ("tab:blue", "s"),
    "dynet-depth": ("tab:cyan", "s"), "fold": ("tab:green", "^"), "fold-n": ("tab:olive", "^"),
    "tensorflow": ("tab:orange", "D"), "cudnn": ("tab:purple", "P"), "pytorch": ("tab:gray", "X"),
}
AXIS_LABEL = {"batch_size": "batch size", "hidden": "hidden size", "leaves": "leaves per tree"}


def _style(system):
    return STYLE.get(system, ("black", "."))


def _footer(fig, notes):
    text = "\n".join(textwrap.fill(n, 170) for n in notes if n)
    if text:
        fig.text(0.01, 0.005, text, fontsize=7, va="bottom", ha="left")
    return text.count("\n") + 1 if text else 0


def _finish(fig, handles, notes):
    """Legend under the title (set by the caller at the top), footnotes at the bottom."""
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.965),
                   ncol=len(handles), frameon=False)
    lines = _footer(fig, notes)
    fig.tight_layout(rect=(0, 0.03 + 0.02 * lines, 1, 0.91))
    return fig


def lines(exp, ok, notes):
    """Time per epoch vs the swept column, one line per system; hollow markers = extrapolated."""
    rows, cols = exp.plot["layout"]
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    handles = {}
    for ax, panel in zip(axes.flat, exp.panels):
        data = ok[ok["panel"] == panel.id]
        for system in panel.systems:
            s = data[data["system"] == system].sort_values(panel.vary)
            if s.empty:
                continue
            color, marker = _style(system)
            x, y = s[panel.vary].to_numpy(), s[exp.plot["y"]].to_numpy()
            extra = s["extrapolated"].to_numpy()
            ax.plot(x, y, color=color)
            handles[system] = Line2D([], [], color=color, marker=marker)
            ax.scatter(x[~extra], y[~extra], color=color, marker=marker, s=28, zorder=3)
            ax.scatter(x[extra], y[extra], facecolors="none", edgecolors=color, marker=marker, s=28, zorder=3)
        ax.set_xscale("log", base=2)
        if exp.plot.get("logy"):
            ax.set_yscale("log")
        ax.set_xticks(panel.values, [str(v) for v in panel.values], fontsize=7)
        ax.set_xlabel(AXIS_LABEL[panel.vary])
        ax.set_ylabel("time per epoch (s)")
        ax.set_title(panel.title, fontsize=9)
    for ax in list(axes.flat)[len(exp.panels):]:
        ax.axis("off")
    if ok["extrapolated"].any():
        notes = ["Hollow markers: time per epoch extrapolated from a measured slice of the epoch "
                 "(time per sample x epoch samples); filled markers: whole epochs measured."] + notes
    return _finish(fig, handles, notes)


def construction(exp, ok, notes):
    """Graph-construction time per epoch as bars per system, labelled with its share of the epoch."""
    rows, cols = exp.plot["layout"]
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4 * rows), squeeze=False)
    handles = {}
    for ax, panel in zip(axes.flat, exp.panels):
        data = ok[ok["panel"] == panel.id]
        width = 0.8 / len(panel.systems)
        for i, system in enumerate(panel.systems):
            s = data[data["system"] == system].set_index(panel.vary)
            pos = [j for j, v in enumerate(panel.values) if v in s.index]
            if not pos:
                continue
            vals = [panel.values[j] for j in pos]
            heights = s.loc[vals, exp.plot["y"]].to_numpy()
            shares = heights / s.loc[vals, exp.plot["share_of"]].to_numpy()
            x = np.array(pos) + (i - (len(panel.systems) - 1) / 2) * width
            handles[system] = ax.bar(x, heights, width, color=_style(system)[0], label=system,
                                     hatch=["//" if e else "" for e in s.loc[vals, "extrapolated"]])
            for xi, h, share in zip(x, heights, shares):
                ax.text(xi, h, f"{share:.0%}", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_yscale("log")
        ax.set_xticks(range(len(panel.values)), [str(v) for v in panel.values])
        ax.set_xlabel(AXIS_LABEL[panel.vary])
        ax.set_ylabel("graph construction per epoch (s)")
        ax.set_title(panel.title + "; labels: share of the epoch", fontsize=9)
    if ok["extrapolated"].any():
        notes = ["Hatched bars: extrapolated from a measured slice of the epoch."] + notes
    return _finish(fig, handles, notes)


def speedup_bars(exp, ok, notes):
    """Speedup of each option set over the baseline variant (all optimizations off), per workload."""
    fig, ax = plt.subplots(figsize=(8, 4))
    base = exp.plot["baseline"]
    variants = [v for v, _ in exp.panels[0].variants if v != base]
    width = 0.8 / len(variants)
    cmap = plt.get_cmap("tab10")
    handles = {}
    for i, variant in enumerate(variants):
        for j, panel in enumerate(exp.panels):
            d = ok[ok["panel"] == panel.id].set_index("variant")[exp.plot["y"]]
            if base not in d.index or variant not in d.index:
                continue
            x = j + (i - (len(variants) - 1) / 2) * width
            handles[variant] = ax.bar(x, d[base] / d[variant], width, color=cmap(i), label=variant)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(exp.panels)), [WORKLOAD_TITLES[p.workload] for p in exp.panels])
    ax.set_ylabel(f"speedup over {base} (time per epoch)")
    return _finish(fig, handles, notes)


def memory(exp, ok, notes):
    """Peak resident memory of each cell's process vs the hidden size (the experiment's h sweeps)."""
    panels = [p for p in exp.panels if p.vary == "hidden"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    handles = {}
    for ax, panel in zip(axes.flat, panels):
        data = ok[(ok["panel"] == panel.id) & ok["peak_rss_mb"].notna()]
        for system in panel.systems:
            s = data[data["system"] == system].sort_values("hidden")
            if s.empty:
                continue
            color, marker = _style(system)
            ax.plot(s["hidden"], s["peak_rss_mb"], color=color, marker=marker, markersize=5)
            handles[system] = Line2D([], [], color=color, marker=marker)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(panel.values, [str(v) for v in panel.values], fontsize=7)
        ax.set_xlim(panel.values[0] / 1.3, panel.values[-1] * 1.3)
        ax.set_xlabel(AXIS_LABEL["hidden"])
        ax.set_ylabel("peak RSS of the cell (MB)")
        ax.set_title(panel.title, fontsize=9)
    return _finish(fig, handles, notes)


KINDS = {"lines": lines, "construction": construction, "speedup_bars": speedup_bars}
