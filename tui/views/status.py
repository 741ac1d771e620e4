"""Live status: the top bar's one line and the overview's panel."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

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
    state = "following" if live.following else "run ended (no file changed for a while); this is the post-mortem view"
    t.append(f"{state} · {live.directory} · {live.files} trace{'' if live.files == 1 else 's'}\n",
             style="bold" if live.following else "")
    if rep.window is not None:
        t.append(f"capture window {rep.window}: {len(rep.ranks)} ranks reported")
        if rep.missing:
            few = ", ".join(map(str, rep.missing[:16])) + (" …" if len(rep.missing) > 16 else "")
            t.append(f", missing {few}", style="yellow")
        t.append("\n")
    for p in live.pending[:4]:
        t.append(f"{'unreadable' if p.stuck else 'waiting'}: {Path(p.path).name} ({p.reason})\n",
                 style="red" if p.stuck else "dim")
    if len(live.pending) > 4:
        t.append(f"… {len(live.pending) - 4} more\n", style="dim")
    return t
