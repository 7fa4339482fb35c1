"""The ablation chart: one bar per method and metric, with its 95% bootstrap interval."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from arag.eval.retrieval import RetrievalReport

PLOTTED = ("recall@10", "ndcg@10", "mrr@10")


def plot_ablation(
    reports: Sequence[tuple[str, RetrievalReport]], path: Path, *, metrics: Sequence[str] = PLOTTED
) -> Path:
    """Grouped bars (metric groups, one bar per method) with CI whiskers, one panel per scope."""
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none needed for a file
    import matplotlib.pyplot as plt
    import numpy as np

    scopes = list(dict.fromkeys(r.scope for _, r in reports))
    fig, axes = plt.subplots(1, len(scopes), figsize=(6.5 * len(scopes), 4.2), squeeze=False)
    for ax, scope in zip(axes[0], scopes, strict=True):
        mine = [(m, r) for m, r in reports if r.scope == scope]
        width = 0.8 / max(1, len(mine))
        x = np.arange(len(metrics))
        for j, (method, rep) in enumerate(mine):
            means = [rep.metrics[k].mean for k in metrics]
            err = [
                [rep.metrics[k].mean - rep.metrics[k].lo for k in metrics],
                [rep.metrics[k].hi - rep.metrics[k].mean for k in metrics],
            ]
            ax.bar(x + (j - (len(mine) - 1) / 2) * width, means, width, yerr=err, capsize=2, label=method)
        ax.set_xticks(x, list(metrics))
        ax.set_ylim(0, 1)
        n = mine[0][1].questions if mine else 0
        ax.set_title(f"{'library-wide' if scope == 'library' else 'paper-scoped'} ({n} questions)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("QASPER validation: evidence retrieval, mean with 95% bootstrap CI")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
