"""Names from traces and file systems, made inert for the sink they are written to (issue 40, item 3).

A kernel, op, process-group or file name is whatever the traced program or its user wrote: it may
hold a newline followed by `::error::…` (a GitHub runner reads any line of a job's output that
begins with `::` as a workflow command, after leading blanks), a terminal escape (`ESC ] 52`
writes the clipboard, `ESC [ 2J` clears the screen), Markdown or HTML (`<details>`, `# heading`),
Rich markup (`[/]` makes Textual raise, `[link=…]` is followed), or a character XML 1.0 forbids
(`\\x00` in JUnit: the file no longer parses). Each sink escapes the names it writes with the
function named after it here; our own sentences around them are written as they are.

Every function first makes the text one printable line (`printable`): that alone keeps a name
from starting a line of its own, so a workflow command can only come from a name that is itself
at a line's start, which `terminal` breaks.
"""

from __future__ import annotations

import html
import re


def printable(text: str) -> str:
    """Text as one line of UTF-8 text. A file name's bytes that are not UTF-8 (which Python keeps
    as surrogate escapes, and neither DuckDB nor a terminal accepts) are written \\xNN; every other
    character that is not printable (controls, ESC, newlines, format characters such as U+202E,
    which reorders what a terminal shows, lone surrogates) as its Python escape: \\x1b, \\n, \\u202e."""
    if text.isprintable():
        return text
    return "".join(_escape_char(c) for c in text)


def _escape_char(c: str) -> str:
    if c.isprintable():
        return c
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:   # surrogateescape's stand-in for an undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    return c.encode("unicode_escape").decode("ascii")


# Every UTF-16 surrogate: a Python str holds one only alone (JSON's "\\ud800" escape, a pickle's
# string, a file name's undecodable byte), and UTF-8 has no encoding for it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """Text that Arrow and DuckDB accept (valid UTF-8, and valid inside JSON text): each lone
    surrogate becomes U+FFFD; everything else is kept."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


# A runner trims leading blanks before it looks for `::` (actions/runner ActionCommand.TryParseV2).
_COMMAND_START = re.compile(r"^(\s*):(?=:)")


def terminal(text: str) -> str:
    """A name for a terminal or a CI log (stdout and stderr of every command): printable, and not
    able to begin a workflow command should it begin a line (its first `:` written \\x3a)."""
    return _COMMAND_START.sub(r"\1\\x3a", printable(text), count=1) if ":" in text else printable(text)


def workflow_data(text: str) -> str:
    """The message of a GitHub workflow command (`::error title=…::MESSAGE`): printable, then `%`,
    CR and LF percent-encoded as actions/toolkit's escapeData does (% first, or the escapes
    themselves would be encoded again). A `::` inside the message is inert: the command ended at
    the first one."""
    return printable(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def workflow_property(text: str) -> str:
    """A property of a workflow command (`title=…`): as data, and `:` and `,` encoded too
    (toolkit's escapeProperty), else `::` would end the properties early."""
    return workflow_data(text).replace(":", "%3A").replace(",", "%2C")


# What Markdown (GitHub's: CommonMark with tables, strikethrough, math and HTML) reads inside a
# line: emphasis, code, links and images, tables' cells, math, and raw HTML and entities. An `_`
# between two letters or digits is never emphasis (CommonMark 6.2), so `non_matmul` stays as it is,
# and a `>` inside a line begins nothing once `<` is escaped, so a note's `->` does too.
_MARKDOWN_INLINE = re.compile(r"([\\`*\[\]<|~&$]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z]))")
# What it reads at a line's start: headings, quotes, lists, setext underlines, ordered lists.
_MARKDOWN_BLOCK = re.compile(r"^(\s*)([#>+=-]|\d+[.)])")


def markdown(text: str) -> str:
    """A name in Markdown (the report's and the gate's, the GitHub step summary): terminal-safe,
    with every character Markdown would read as syntax backslash-escaped, which CommonMark renders
    as the character itself."""
    out = _MARKDOWN_INLINE.sub(r"\\\1", terminal(text))
    # "1." is escaped as "1\\.", a marker character by a backslash before it.
    return _MARKDOWN_BLOCK.sub(lambda m: m.group(1) + (m.group(2)[:-1] + "\\" + m.group(2)[-1]), out, count=1)


def html_text(text: str) -> str:
    """A name in HTML (the report's page, the gate's): terminal-safe, then `<>&"'` as entities.
    A page written to stdout is read by a CI log line by line too."""
    return html.escape(terminal(text))


def xml(text: str) -> str:
    """A name in XML 1.0 (JUnit): printable, so no character XML 1.0 forbids (C0 controls but
    tab and newlines, U+FFFE/U+FFFF, lone surrogates) is left; ElementTree escapes `<>&"`."""
    return terminal(text)


def markup(text: str) -> str:
    """A name inside Rich or Textual markup: terminal-safe, with `[` escaped, so `[/]` and
    `[link=…]` are shown, not read. Where no markup is wanted, give the widget a `Text` of
    `terminal(name)` instead."""
    return terminal(text).replace("[", "\\[")
