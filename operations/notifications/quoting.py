"""How a value someone else chose is written into a notice: as data, never as our words.

An intent's reference is any text up to 200 characters that an agent (an AI model a prompt
injection may steer) sends; its principal and tenant name an agent an administrator created.
Written as they are, a reference holding ``"\\nApproval waiting: https://evil.example/..."``
starts a line of its own that reads like ours, and a Slack ``<https://...|Approve here>`` becomes
a link to the attacker's page (issue 39, item 8). So every such value goes through ``as_data``:

- **one line, quoted**: the value between double quotes, with backslash escapes as in a JSON or
  Python string literal: ``\\n``, ``\\r``, ``\\t``, ``\\"``, ``\\\\``, and ``\\uXXXX`` (``\\UXXXXXXXX``
  past U+FFFF) for every other character that is not visible text: controls (C0, DEL, C1 such
  as U+0085), format characters (zero-width, bidirectional overrides), line and paragraph
  separators (U+2028, U+2029), spaces other than U+0020, surrogates, private use and
  unassigned code points (Unicode general categories Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs);
- **no link**: ``://`` is written ``[:]//`` and every dot between two characters that are not
  spaces ``[.]`` (``evil[.]example``, ``1[.]2[.]3[.]4``, ``exa\u0308[.]com``), the usual
  "defanging", so no mail or chat client makes a link of a URL, a host name or an address in
  it; the only link in a notice is the console's. A dot counts whatever its spelling: ``.``, the
  ideographic and full-width dots, the small full stop U+FE52 and the one-dot leader U+2024
  (NFKC and IDNA read them all as ``.``).

The escaping is one-way: a value that itself contains ``[.]`` reads the same as a defanged dot.
Slack's own control characters (``&``, ``<``, ``>``) are escaped for the whole message where it
is sent (``operations.notifications.channels.send_slack``).
"""

from __future__ import annotations

import re
import unicodedata

#: Characters written as their two-character escape.
_SHORT_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}

#: Unicode general categories that are not visible text (Cc controls, Cf format, Cs surrogates,
#: Co private use, Cn unassigned, Zl/Zp line and paragraph separators).
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})

# "scheme://" of any URL.
_SCHEME = re.compile(r"://")
# A dot in any spelling NFKC or IDNA reads as "." (ideographic, full-width, half-width, small
# full stop, one-dot leader) between two characters that are not spaces: a host name's label
# separator, an IP address's, a domain's TLD, whatever precedes it (a combining mark, a hyphen).
_HOST_DOT = re.compile(r"(?<=\S)[.\u3002\uff0e\uff61\ufe52\u2024](?=\S)")


def _escaped(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    category = unicodedata.category(char)
    if category in _INVISIBLE or (category == "Zs" and char != " "):
        code = ord(char)
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return char


def as_data(value: object) -> str:
    """``value`` (its ``str``) as one inert, double-quoted line: ``'ord-77\\nApproval: https://x.io/'``
    becomes ``'"ord-77\\\\nApproval: https[:]//x[.]io/"'``. See the module's docstring for the
    escapes and the defanging."""
    text = "".join(_escaped(char) for char in str(value))
    text = _HOST_DOT.sub("[.]", _SCHEME.sub("[:]//", text))
    return f'"{text}"'


def one_line(value: object) -> str:
    """``value`` with the escapes of ``as_data`` but neither quotes nor defanging: for names this
    deployment chose itself (a registered action's name), which must still never break a line."""
    return "".join(char if char == '"' else _escaped(char) for char in str(value))
