"""Text from the wire, made safe to show: every C0/C1 control character (and DEL) escaped.

Whatever came off the bus (app ids, unit names, hostnames, bodies, error messages) is hostile text: a
client that sets its app id to ``ESC]0;...ESC[2J`` would retitle and clear an operator's terminal, and
C1 codes (U+0080-U+009F, e.g. U+009B, a one-character CSI) do the same on terminals that honour them.
The CLI prints, the console log renders and the web bounds its labels through this one definition.
"""

from __future__ import annotations

# C0, DEL and C1: the characters a terminal may act on instead of showing.
CONTROL_CHARACTERS = (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))
_ESCAPED = {code: f"\\u{code:04x}" for code in CONTROL_CHARACTERS}
_ESCAPED_KEEP_LINES = {code: text for code, text in _ESCAPED.items() if chr(code) not in "\n\t"}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every C0/C1 control character (and DEL) written as ``\\u00XX``: shown, never obeyed.

    ``lines``: keep newlines and tabs (a multi-line body or traceback); otherwise the text stays on one
    line, so a message cannot forge the lines after it. The escape is also valid inside a JSON string.
    """
    return text.translate(_ESCAPED_KEEP_LINES if lines else _ESCAPED)
