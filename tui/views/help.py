"""`?`: every key, by view, and how to read what is on the screen."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# diag — keys

**Everywhere**: `1`–`5` switch views (Overview, Findings, Ranks, Timeline, Collectives) ·
`esc` back to where a jump came from · `tab` next pane · `T` light/dark theme · `?` this help · `q` quit.
The mouse works too: click a tab, a row, a heatmap cell (again to open it) or a point of a lane.

| view | keys |
|---|---|
| Overview | `↑↓` pick a top finding · `enter` open it |
| Findings | `↑↓` pick · `enter` go to its evidence list · `enter` or `g` on evidence: show it in the timeline or the collectives table |
| Ranks | arrows (or `hjkl`) move · `m`/`M` next/previous metric · `s` step time · `o` the rank that stands out most, in the metric where it does (says so when none does) · `enter` open that rank's step in the timeline |
| Timeline | `←→` move the cursor (`shift` ×10; past the edge pans) · `↑↓` rank · `+`/`-` zoom at the cursor · `0` fit the step · `[` `]` previous/next step · `home`/`end` view edges · `p` the critical path |
| Collectives | `↑↓` pick a group · `enter` its instances · `enter` or `g` on an instance: the timeline at the rank that arrived last |

# Reading it

- **MFU points**: each ledger bucket's share of the step time. At the dense peak the whole step
  would be model compute, so the waterfall goes from 100 down to the achieved MFU, one bar per loss.
- **Timeline lanes**: per rank, the host phase (thin bar: forward, backward, optimizer, data
  loader) above the GPU state (compute, communication only, copy only, idle). All ranks are on
  the reference rank's clock (offsets from matched collectives). `p` highlights the step's
  critical path (docs/critical_path.md): the work the step waited on keeps its colour, its idle
  and host time shows as `━`, everything else dims.
- **Collectives**: *exposed* is the time the GPU did nothing but communicate; *waiting* is the part
  spent waiting for the last rank to arrive. Bus bandwidth is compared with the link the group
  should run on: NVLink inside a host, InfiniBand across hosts.
- **Live**: a new trace is read once it is complete — a `.json.gz` still being written is waited
  for, never reported as an error.

`esc`, `?` or `q` closes this help.
"""


class Help(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Markdown(HELP)
