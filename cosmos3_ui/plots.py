"""The actions plot: each action channel over time, rendered with matplotlib to an RGB array."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LEGEND_MAX_CHANNELS = 30  # past this many channels a legend is noise; the plot keeps its curves only


def actions_figure(actions, *, domain: str = "", fps: float | None = None, names: list[str] | None = None):
    """A matplotlib Figure of `actions` ([steps, channels]) as lines over time, each channel named
    (`names`, from the domain table) in a legend beside the plot, never over the curves."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = np.asarray(actions, dtype=np.float64)
    if data.ndim == 1:
        data = data[:, None]
    steps, channels = data.shape
    figure = Figure(figsize=(8.0, 3.2), dpi=100)
    FigureCanvasAgg(figure)  # draws off-screen; no global pyplot state
    axes = figure.add_subplot(1, 1, 1)
    x = np.arange(steps) / fps if fps else np.arange(steps)
    for channel in range(channels):
        label = names[channel] if names and channel < len(names) else f"a{channel}"
        axes.plot(x, data[:, channel], linewidth=1.2, label=label)
    axes.set_xlabel("time (s)" if fps else "step")
    axes.set_ylabel("value")
    title = f"{steps} steps x {channels} channels"
    axes.set_title(f"{domain}: {title}" if domain else title, fontsize=10)
    axes.grid(True, alpha=0.3)
    if channels <= LEGEND_MAX_CHANNELS:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, ncol=1 if channels <= 12 else 2,
                    frameon=False, borderaxespad=0.0)
    figure.tight_layout()
    return figure


def actions_plot(actions, *, domain: str = "", fps: float | None = None, names: list[str] | None = None) -> np.ndarray:
    """[H, W, 3] uint8 image of `actions_figure`."""
    figure = actions_figure(actions, domain=domain, fps=fps, names=names)
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()


def actions_from_file(path: str | Path) -> np.ndarray | None:
    """The array saved by the engine in actions.json, or None when unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    rows = data.get("actions") if isinstance(data, dict) else data
    try:
        array = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return array if array.ndim == 2 and array.size else None
