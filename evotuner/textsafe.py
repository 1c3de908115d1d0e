"""Making untrusted text safe where it lands: a terminal, or a C++ comment.

Study names, device names, space names, compiler versions and URLs come from
users, databases and other machines. Before any of them is shown on a terminal
or written into a generated header it goes through one of these functions, so
that it is printed literally and harmlessly:

* :func:`for_terminal`: control characters (ESC, BEL, CR, newline, C1 codes,
  bidi overrides) become visible escapes such as ``\\x1b``; the result never
  moves the cursor, retitles the window or clears the screen. Use it with
  ``rich.text.Text`` (or ``markup=False``) so ``[bold]`` stays literal.
* :func:`for_c_comment`: one line of plain ASCII that cannot end a ``//``
  comment early or continue it onto the next line (no newline, no ``\\``,
  no ``*/``, no trigraph ``??``, no non-ASCII).
"""

from __future__ import annotations

import unicodedata

#: Unicode categories that are never printed raw: controls, format characters (bidi
#: overrides, zero-width joiners), line/paragraph separators, surrogates, unassigned.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def for_terminal(text: object) -> str:
    """``text`` with every control or invisible-format character written as an escape."""
    s = str(text)
    if s.isprintable() and s.isascii():
        return s
    return "".join(_escape(ch) if unicodedata.category(ch) in _UNSAFE_CATEGORIES else ch for ch in s)


def for_c_comment(text: object) -> str:
    """``text`` as one line of printable ASCII safe inside a ``//`` comment.

    Whitespace runs (newlines included) become one space; every character outside
    printable ASCII, and the backslash, becomes ``<U+XXXX>``; ``*/`` and ``??``
    are split so no comment ends and no trigraph forms.
    """
    words = " ".join(str(text).split())
    out = []
    for ch in words:
        if ch == "\\" or not (" " <= ch <= "~"):
            out.append(f"<U+{ord(ch):04X}>")
        else:
            out.append(ch)
    s = "".join(out)
    while "*/" in s or "/*" in s or "??" in s:
        s = s.replace("*/", "* /").replace("/*", "/ *").replace("??", "? ?")
    return s
