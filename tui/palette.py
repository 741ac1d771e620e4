"""Colours of the timeline lanes and the heatmap, chosen to read on dark and light themes alike."""

from __future__ import annotations

# GPU states (states.py). Idle is drawn as a dim dot, not a colour: it is the absence of work.
STATE_COLORS = {"compute": "#43a047", "comm": "#8e24aa", "copy": "#fb8c00"}
STATE_ORDER = ("compute", "comm", "copy", "idle")

# The critical path, drawn over the GPU lanes where they show no work (the path's idle and host time).
PATH_COLOR = "#ffd54f"

# Host phases (diag/timeline/phases.py PHASES).
PHASE_COLORS = {
    "forward": "#1e88e5", "backward": "#f4511e", "recompute": "#d81b60",
    "optimizer": "#00897b", "dataloader": "#fdd835", "other": "#9e9e9e", "sync": "#8d6e63",
}
PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "recompute": "recomp", "optimizer": "optim",
               "dataloader": "data", "other": "other", "sync": "sync"}

# viridis in 10 steps: perceptually uniform and legible for red-green colour blindness.
HEAT = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e",
        "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725")


def heat_color(x: float) -> str:
    """x in [0, 1] → a colour of the scale."""
    i = min(len(HEAT) - 1, max(0, int(x * len(HEAT))))
    return HEAT[i]


def text_on(bg: str) -> str:
    """Black or white, whichever reads on `bg` (relative luminance, WCAG)."""
    r, g, b = (int(bg[i:i + 2], 16) / 255 for i in (1, 3, 5))
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#000000" if lum > 0.45 else "#ffffff"
