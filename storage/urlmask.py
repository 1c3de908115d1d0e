"""Database URLs as they may appear in a message: every secret masked.

SQLAlchemy takes a password in several places: the userinfo (``user:pw@host``),
the query string (``?password=``, ``?sslpassword=``, percent-encoded keys such as
``?p%61ssword=``), and inside driver strings (``?odbc_connect=...PWD=pw;...``).
:func:`mask_url` hides all of them, for a parsed :class:`~sqlalchemy.engine.URL`
and for a raw string that does not parse (so an error about a malformed URL does
not print its password either).
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

from sqlalchemy.engine import URL

MASK = "***"
#: Query keys (lower-cased, after percent-decoding) whose value is a secret.
SECRET_KEYS = frozenset({
    "password", "passwd", "pwd", "pass", "sslpassword", "secret", "token", "access_token",
    "api_key", "apikey", "sslkey_password", "auth_token", "private_key_passphrase",
})
_USERINFO = re.compile(r"^(?P<head>[^:/?#]+://[^:/?#@]*):(?P<pw>[^@]*)@")
_INNER = re.compile(r"(?i)\b(password|passwd|pwd)(\s*(?:=|%3D)\s*)([^;&]*)")


def _is_secret(key: str) -> bool:
    k = unquote_plus(key).strip().lower()
    return k in SECRET_KEYS or "password" in k or "secret" in k or k.endswith("token")


def _mask_query(query: str) -> str:
    parts = []
    for sep_part in re.split(r"([&;])", query):
        if sep_part in ("&", ";") or "=" not in sep_part:
            parts.append(sep_part)
            continue
        key, value = sep_part.split("=", 1)
        if _is_secret(key):
            parts.append(f"{key}={MASK}")
        else:
            decoded = unquote_plus(value)
            parts.append(f"{key}={_INNER.sub(lambda m: m.group(1) + m.group(2) + MASK, decoded)}"
                         if _INNER.search(decoded) else sep_part)
    return "".join(parts)


def mask_url(url: URL | str) -> str:
    """``url`` with its password and every secret query value replaced by ``***``."""
    if isinstance(url, URL):
        text = url.render_as_string(hide_password=True)
    else:
        text = str(url)
        text = _USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text, count=1)
    base, sep, query = text.partition("?")
    if sep:
        query, hash_sep, fragment = query.partition("#")
        text = f"{base}?{_mask_query(query)}{hash_sep}{fragment}"
    return _INNER.sub(lambda m: m.group(1) + m.group(2) + MASK, text) if "odbc" in text.lower() else text
