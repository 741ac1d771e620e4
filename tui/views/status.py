"""Live status: the top bar's one line and the overview's panel."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from diag.runtime.sanitize import terminal
from tui.queries import fmt_ranks
from tui.snapshot import LiveStatus


def live_text(live: LiveStatus) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis", justify="right")
    rep = live.reported
    if live.following:
        t.append("● live ", style="bold green")
    else:
        t.append("run ended ", style="bold")
    if rep.window is not None:
        total = rep.world_size or len(rep.ranks)
        t.append(f"w{rep.window} {len(rep.ranks)}/{total} ranks ")
    waiting = [p for p in live.pending if not p.stuck]
    stuck = [p for p in live.pending if p.stuck]
    if waiting:
        t.append(f"· {len(waiting)} arriving ", style="yellow")
    if stuck:
        t.append(f"· {len(stuck)} unreadable ", style="red")
    return t


def live_detail(live: LiveStatus) -> Text:
    """The overview's live panel: which ranks reported, what is still being written."""
    t = Text()
    rep = live.reported
    state = "following" if live.following else "run ended (no new files lately): post-mortem view"
    t.append(f"{state} · {terminal(live.directory)} · {live.files} trace{'' if live.files == 1 else 's'}",
             style="bold" if live.following else "")
    if live.idle_s is not None:
        t.append(f" · last change {live.idle_s:.0f} s ago", style="dim")
    t.append("\n")
    if rep.window is not None:
        t.append(f"capture window {rep.window}: {len(rep.ranks)} ranks reported")
        if rep.missing:
            t.append(f", missing {fmt_ranks(rep.missing)}", style="yellow")
        t.append("\n")
    for p in live.pending[:4]:
        t.append(f"{'unreadable' if p.stuck else 'waiting'}: {terminal(Path(p.path).name)} ({p.reason})\n",
                 style="red" if p.stuck else "dim")
    if len(live.pending) > 4:
        t.append(f"… {len(live.pending) - 4} more\n", style="dim")
    return t
