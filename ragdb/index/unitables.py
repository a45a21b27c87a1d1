"""The Unicode tables the compiled passages module (``cpassages``) reads words through, made from
Python's own Unicode data (``str.casefold``, ``str.isalnum``, ``unicodedata``), one entry for each
of the 65,536 BMP code points:

* :func:`compat_table`: each character to its NFKC form where that is one other character
  (``cpassages.fold_compat``);
* :func:`raw_table`: each character to its case folding, with the folded character's class
  (``cpassages.shingles_raw``);
* :func:`nfkc_table`: each character to the raw entry of its one-character NFKC form, marked
  safe where the one-pass NFKC read may use it (``cpassages.shingles_nfkc``).

``ragdb.index.hits`` documents what the entries mean and why they are right. This module only
makes them, with the standard library alone: setup.py runs it on its own at build time
(:func:`write_header`), so that the compiled module holds the tables as constant data, and
:func:`ragdb.index.hits` reads them from there. Making them took ~17 ms of the first search with
a non-ASCII text in every process (a third of a ``ragdb search``'s own work), and they held
1 MiB of every reader's memory, where the constant data costs the pages a search touches. The
build's Python is the one the module is compiled for, so its Unicode data is the same version
(``unicodedata.unidata_version``, which the module records and ``hits`` compares); where it is
not, ``hits`` makes them here instead (slower, the same tables).
"""

from __future__ import annotations

import re
import unicodedata
from array import array

BMP = 0x10000
#: A raw entry: the character case folds to more than one character, or to one past the BMP.
MANY = 0xFFFFFFFF
#: The bit of a :func:`nfkc_table` entry that marks a safe form (``cpassages.SAFE``).
NFKC_SAFE = 1 << 26
#: The classes of a raw entry, in bits 24-25: a word character (``str.isalnum``), a CJK character.
WORD, CJK = 1, 2
#: The CJK characters: each a word of its own (``hits._CJK``, the same ranges).
CJK_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF))
# The blocks whose characters :func:`compat_table` maps (where NFKC makes one character of
# one): Latin-1's (no-break space, superscripts), general punctuation, letterlike symbols,
# enclosed alphanumerics, CJK symbols and punctuation, enclosed CJK and compatibility, CJK
# compatibility ideographs, and the half-width and full-width forms (the commas and brackets
# of most Chinese text).
COMPAT_BLOCKS = ((0x00A0, 0x00FF), (0x2000, 0x218F), (0x2460, 0x24FF), (0x3000, 0x303F), (0x3200, 0x33FF),
                 (0xF900, 0xFAFF), (0xFE30, 0xFE6F), (0xFF00, 0xFFEF))
# The BMP ranges whose characters :func:`nfkc_table` may mark safe, checked one by one (Latin,
# Greek, Cyrillic, punctuation and symbols, CJK punctuation and kana, the half-width and
# full-width forms), and the ranges whose every character is safe without a check (the CJK
# ideographs and the Hangul syllables: their own NFKC forms, of combining class 0, with which
# no character before them composes). No character of either is a combining class 0 character
# a character before it may compose with (tests/index/test_passages.py checks both lists
# against every composition Python's Unicode data holds).
SAFE_CHECKED = ((0x0000, 0x024F), (0x0370, 0x052F), (0x2000, 0x2BFF), (0x3000, 0x30FF), (0xFF00, 0xFFEF))
SAFE_ALWAYS = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3))

_ALNUM_RUN = re.compile(r"[^\W_]+")  # exactly str.isalnum: both are Py_UNICODE_ISALNUM


def _bmp() -> str:
    """Every BMP code point in order, one string (lone surrogates included)."""
    return "".join(map(chr, range(BMP)))


def compat_table() -> array:
    """uint32 (``array("I")``): each BMP code point to itself, but those of
    :data:`COMPAT_BLOCKS` whose NFKC form is one other character to that character."""
    table = array("I", range(BMP))
    for lo, hi in COMPAT_BLOCKS:
        for code in range(lo, hi + 1):
            folded = unicodedata.normalize("NFKC", chr(code))
            if len(folded) == 1 and folded != chr(code):
                table[code] = ord(folded)
    return table


def fold_table() -> array:
    """uint32: each BMP code point to its ``str.casefold`` (which folds each character on its
    own), :data:`MANY` where that is more than one character."""
    return array("I", [ord(f) if len(f := c.casefold()) == 1 else MANY for c in _bmp()])


def raw_table(fold: array | None = None) -> array:
    """uint32: each BMP code point to its case folding (:func:`fold_table`) in the low 16 bits
    and the folded character's class in bits 24-25 (:data:`WORD`: ``str.isalnum``, which ``_``
    is not; :data:`CJK`, a word of its own; 0 neither), :data:`MANY` where it folds to more than
    one character or to one past the BMP."""
    fold = fold_table() if fold is None else fold
    classes = bytearray(BMP)
    for m in _ALNUM_RUN.finditer(_bmp()):
        classes[m.start():m.end()] = bytes([WORD]) * (m.end() - m.start())
    for lo, hi in CJK_RANGES:
        classes[lo:hi + 1] = bytes([CJK]) * (hi + 1 - lo)
    return array("I", [MANY if f >= BMP else f | classes[f] << 24 for f in fold])


def nfkc_table(raw: array, compat: array) -> array:
    """uint32: each BMP character ``c`` to the ``raw`` entry of its NFKC form where that is one
    character (``compat``'s, else ``c`` itself), with bit :data:`NFKC_SAFE` where that form ``f``
    is safe: ``c`` and ``f`` lie in the ranges of :data:`SAFE_CHECKED` or :data:`SAFE_ALWAYS`,
    ``f`` is NFKC-normalized alone, of combining class 0, and case folds to one character; 0
    (not safe) for every other character (``hits._nfkc_table`` says why that suffices)."""
    safe = bytearray(BMP)
    for lo, hi in SAFE_ALWAYS:
        safe[lo:hi + 1] = b"\x01" * (hi + 1 - lo)
    for lo, hi in SAFE_CHECKED:
        forms = [chr(f) for f in compat[lo:hi + 1]]
        # each form's NFKC in one call: U+E000 between them (private use: a starter, its own
        # form, composing with nothing, in no range), which keeps each apart
        normal = unicodedata.normalize("NFKC", "\ue000".join(forms)).split("\ue000")
        safe[lo:hi + 1] = bytes(n == f and not unicodedata.combining(f) for f, n in zip(forms, normal))
    table = array("I", bytes(4 * BMP))
    for code in range(BMP):
        form = compat[code]
        # the form itself in the ranges too (a half-width Hangul letter's is a conjoining jamo)
        if safe[code] and form < BMP and safe[form] and raw[form] != MANY:
            table[code] = raw[form] | NFKC_SAFE
    return table


def tables() -> tuple[array, array, array]:
    """(:func:`compat_table`, :func:`raw_table`, :func:`nfkc_table`), made here (~0.1 s)."""
    compat, raw = compat_table(), raw_table()
    return compat, raw, nfkc_table(raw, compat)


#: The names the compiled module knows the tables by, in the order of :func:`tables`.
C_NAMES = ("RAGDB_COMPAT_TABLE", "RAGDB_RAW_TABLE", "RAGDB_NFKC_TABLE")


def header() -> str:
    """C source declaring :func:`tables` as constant arrays (:data:`C_NAMES`) and the Unicode
    version they were made from (``RAGDB_UNIDATA_VERSION``): ``ragdb_unitables.h``, which
    setup.py writes where ``cpassages.pyx`` is compiled."""
    lines = ["/* Generated by ragdb/index/unitables.py at build time: do not edit. */",
             "#include <stdint.h>",
             f'#define RAGDB_UNIDATA_VERSION "{unicodedata.unidata_version}"']
    for name, table in zip(C_NAMES, tables()):
        lines.append(f"static const uint32_t {name}[{BMP}] = {{")
        lines.extend(",".join(map(str, table[i:i + 32])) + "," for i in range(0, BMP, 32))
        lines.append("};")
    return "\n".join(lines) + "\n"


def write_header(path: str) -> None:
    """Write :func:`header` to ``path``."""
    with open(path, "w", encoding="ascii") as f:
        f.write(header())


if __name__ == "__main__":  # pragma: no cover - setup.py loads this file by its path instead
    import sys

    write_header(sys.argv[1])
