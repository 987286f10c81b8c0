"""Standard output and error as ``btk`` finds them: closed, or unable to encode what it prints.

``btk … >&-`` starts Python with no standard output at all (``sys.stdout is None``); the output
then cannot be written, which is one line on stderr and exit 2 before any command runs.
``PYTHONIOENCODING=ascii``, the C locale without UTF-8 mode (``LC_ALL=C PYTHONUTF8=0``) or a
terminal in a legacy encoding cannot encode the tables' ``±``, ``≤`` or ``…``: the streams are
switched to ``backslashreplace``, so such a character prints as ``\\xb1`` and nothing raises
``UnicodeEncodeError``.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any, TextIO

#: The error handlers that raise on a character the encoding lacks: ``strict``, and
#: ``surrogateescape``, which Python uses for standard output in the C locale
#: (https://docs.python.org/3/library/sys.html#sys.stdout).
RAISING_ERROR_HANDLERS = ("strict", "surrogateescape")


def closed(stream: TextIO | None) -> bool:
    """Whether ``stream`` cannot be written at all: absent (its descriptor was closed at start) or closed."""
    return stream is None or bool(getattr(stream, "closed", False))


def tolerate_unencodable(stream: TextIO | None) -> None:
    """Print what ``stream``'s encoding cannot hold as backslash escapes instead of raising."""
    reconfigure: Any = getattr(stream, "reconfigure", None)
    if closed(stream) or reconfigure is None or getattr(stream, "errors", None) not in RAISING_ERROR_HANDLERS:
        return
    with contextlib.suppress(ValueError, io.UnsupportedOperation):
        reconfigure(errors="backslashreplace")
