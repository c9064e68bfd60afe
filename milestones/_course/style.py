"""Colour for the course tools: ANSI escapes on a terminal, plain text everywhere else.

``--color auto`` (the default) colours only when the stream is a TTY and the ``NO_COLOR`` environment variable
is unset or empty (https://no-color.org); ``always`` and ``never`` override both. Pipes, files and tests get
plain text, so what the tools print can be grepped and pasted into docs.
"""

from __future__ import annotations

import os
import shutil
from typing import TextIO

CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35",
         "cyan": "36"}
COLOR_CHOICES = ("auto", "always", "never")


def wants_colour(choice: str, stream: TextIO) -> bool:
    """Whether to colour what goes to ``stream`` under ``--color choice``."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


def terminal_width(default: int = 100) -> int:
    """The terminal's width in columns (``$COLUMNS`` wins; ``default`` when output is not a terminal)."""
    return shutil.get_terminal_size((default, 24)).columns


class Style:
    """``style(text, "bold", "green")``: ``text`` wrapped in those ANSI codes, or unchanged when colour is off."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, *names: str) -> str:
        if not self.enabled or not names or not text:
            return text
        return f"\033[{';'.join(CODES[n] for n in names)}m{text}\033[0m"
