"""The paper's headline claims next to what the CSVs in RESULTS measured (reads CSVs only).

    python -m plots.claims --results results      # -> RESULTS/figures/claims.md

Each row names the claim, the cells it is computed from, and the measured ratio range. Ratios are
of per-epoch times from the same sweep (so the same machine, threads and profile).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from .load import read_csv


def _ok(results: Path, name: str) -> pd.DataFrame:
    path = results / f"{name}.csv"
    if not path.exists():
        return pd.DataFrame()
    df = read_csv(path)
    return df[df.status == "ok"]


def _ratios(df, panels, slow, fast="cavs", on=("panel", "batch_size", "hidden")):
    """epoch_s of `slow` / epoch_s of `fast`, per matching cell of the given panels (keyed by panel
    too: the cell bs = 64, h = 512 is in both a batch-size panel and a hidden-size panel, and
    pairing without the panel multiplied its rows)."""
    cols = list(on)
    a = df[df.panel.isin(panels) & (df.system == slow)].set_index(cols).epoch_s
    b = df[df.panel.isin(panels) & (df.system == fast)].set_index(cols).epoch_s
    r = (a / b).dropna()
    return r


def _span(r) -> str:
    if len(r) == 0:
        return "not measured"
    return f"{r.min():.2f}x - {r.max():.2f}x (median {r.median():.2f}x, {len(r)} cells)"


def _where(frames) -> str:
    """'GPU' or 'CPU, 1 thread': where the cells of these sweeps ran, from their own `device` and
    `threads` columns (Cavs's cells on cuda: GPU)."""
    df = pd.concat(frames, ignore_index=True)
    if "device" in df and "system" in df and (df[df.system == "cavs"].device.astype(str) == "cuda").any():
        return "GPU"
    threads = (sorted({int(t) for t in df.threads.dropna()}) if "threads" in df else []) or [1]
    return f"CPU, {'/'.join(map(str, threads))} thread{'s' if threads != [1] else ''}"


def measured_on(results: Path) -> str:
    """Where the claims' cells ran: 'GPU' or 'CPU, N thread(s)'."""
    return _where([_ok(results, n) for n in ("fig8", "ablation", "fig9")])


def claims(results: Path) -> str:
    fig8, abl, fig9 = _ok(results, "fig8"), _ok(results, "ablation"), _ok(results, "fig9")
    rows = []
    if len(fig8):
        rows += [
            ("Cavs 2-3x faster than TensorFlow on Var-LSTM (GPU)", "fig8 b, f: tensorflow / cavs",
             _span(_ratios(fig8, ["b", "f"], "tensorflow"))),
            ("Cavs faster than DyNet on Var-LSTM", "fig8 b, f: dynet / cavs", _span(_ratios(fig8, ["b", "f"], "dynet"))),
            ("Cavs close to cuDNN on Fixed-LSTM (cuDNN is the bound)", "fig8 a, e: cudnn / cavs",
             _span(_ratios(fig8, ["a", "e"], "cudnn"))),
            ("Cavs 8-10x faster than Fold on Tree-LSTM (GPU)", "fig8 d, h: fold / cavs",
             _span(_ratios(fig8, ["d", "h"], "fold"))),
            ("Cavs faster than DyNet on Tree-LSTM", "fig8 d, h: dynet / cavs", _span(_ratios(fig8, ["d", "h"], "dynet"))),
            ("Cavs faster than Fold / DyNet on Tree-FC", "fig8 c, g: fold / cavs; dynet / cavs",
             _span(_ratios(fig8, ["c", "g"], "fold")) + "; " + _span(_ratios(fig8, ["c", "g"], "dynet"))),
            # not a claim of the paper: the bar a runtime must clear to be worth adopting (GUIDE.md)
            ("(not in the paper) Cavs faster than PyTorch batched by level on the trees",
             "fig8 c, g: pytorch-levels / cavs; d, h: pytorch-levels / cavs",
             _span(_ratios(fig8, ["c", "g"], "pytorch-levels")) + "; "
             + _span(_ratios(fig8, ["d", "h"], "pytorch-levels"))),
        ]
        serial = fig8[(fig8.panel == "d") & (fig8.system == "cavs-serial")].epoch_s
        batched = fig8[(fig8.panel == "d") & (fig8.system == "cavs") & (fig8.batch_size == 128)].epoch_s
        if len(serial) and len(batched):
            rows.append(("Batching 36x faster than serial at bs = 128 (GPU)",
                         "fig8 d: cavs-serial (mean over its bs) / cavs at bs = 128",
                         f"{serial.mean() / batched.iloc[0]:.1f}x"))
    if len(abl):
        base = abl[abl.variant == "all-off"].set_index("workload").epoch_s
        for variant in ("lazy", "eager", "fusion", "streaming", "share_tokens", "all-on"):
            on = abl[abl.variant == variant].set_index("workload").epoch_s
            r = (base / on).dropna()
            text = ", ".join(f"{w} {v:.2f}x" for w, v in r.items()) or "not measured"
            claim = {"lazy": "Lazy batching: about 20% (1.2x)", "fusion": "Fusion: about 20% (1.2x)",
                     "streaming": "Streaming: a gain on the GPU", "eager": "Eager batching (not in the paper)",
                     "share_tokens": "Token sharing: a word's products once per batch (not in the paper)",
                     "all-on": "All optimizations together"}[variant]
            rows.append((claim, f"ablation: all-off / {variant}", text))
    if len(fig9):
        share = fig9.assign(share=fig9.construct_s / fig9.total_s).groupby("system").share.median()
        rows.append(("Cavs's graph construction is a small share of the epoch (Fold and DyNet pay more)",
                     "fig9: median construct_s / total_s",
                     ", ".join(f"{s} {v:.0%}" for s, v in share.items())))
    lines = [f"| paper's claim | measured from | measured here ({_where([fig8, abl, fig9])}) |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m plots.claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    out = Path(args.results) / "figures" / "claims.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(claims(Path(args.results)))
    print(out.read_text())


if __name__ == "__main__":
    main()
