"""Figures of the pipeline and the experiments: headless matplotlib and atomic PNG writing."""

from __future__ import annotations

from pathlib import Path

from uamt.core.fileio import atomic_save_figure


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (stages run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Save a matplotlib figure as PNG atomically (:func:`uamt.core.fileio.atomic_save_figure`) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
