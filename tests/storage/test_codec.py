"""``ragdb.storage.codec.loads_exact``: JSON from outside ragdb, with every integer the number written."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragdb.storage.codec import loads_exact

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12)


@given(values)
def test_every_value_reads_back_as_written(value):
    """orjson read an integer outside -2**63 .. 2**64-1 as a float that is another number."""
    text = json.dumps(value)
    for given_as in (text, text.encode()):
        got = loads_exact(given_as)
        assert got == value and json.dumps(got) == text


@pytest.mark.parametrize("number", [2 ** 64, 2 ** 70 + 1, -2 ** 63 - 1, -10 ** 30])
def test_integers_past_orjsons_range_stay_integers(number):
    assert isinstance(orjson.loads(str(number)), float)  # (what it fixes)
    assert loads_exact(f'{{"n": [{number}]}}') == {"n": [number]}


@pytest.mark.parametrize("text", ['{"n": NaN}', '[Infinity]', '["\\ud800"]', '{"n": 1e400, "m": 12345678901234567890}'])
def test_what_orjson_refuses_stays_refused(text):
    """The standard library reads these; they are not JSON (or not a number), and stay refused."""
    with pytest.raises(orjson.JSONDecodeError):
        loads_exact(text)


def test_a_refusal_of_the_second_reading_is_orjsons_error(monkeypatch):
    """Callers catch orjson.JSONDecodeError; the standard library's error would escape them."""
    import ragdb.storage.codec as codec

    def refuse(text):
        raise ValueError("refused")

    monkeypatch.setattr(codec.json, "loads", refuse)
    for text in ('{"n": 12345678901234567890123}', b'{"n": 12345678901234567890123}'):
        with pytest.raises(orjson.JSONDecodeError, match="refused"):
            codec.loads_exact(text)
    assert codec.loads_exact('{"n": 5}') == {"n": 5}  # (not read twice)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_nesting_the_standard_library_cannot_read_is_refused_as_json(as_bytes):
    """orjson reads 1,000 levels of nesting; the second reading (of a text holding an integer
    past orjson's range) raised RecursionError, which no caller catches: an import, an added
    JSONL file and --where failed with an internal error, an HTTP request with a 500."""
    depth = 1000
    text = '{"n": 12345678901234567890123, "x": ' + "[" * depth + "]" * depth + "}"
    orjson.loads(text)  # (what orjson reads)
    with pytest.raises(orjson.JSONDecodeError, match="recursion"):
        loads_exact(text.encode() if as_bytes else text)


def test_only_a_reading_with_a_float_past_2_63_is_read_again(monkeypatch):
    """Digits in a string (a phone number, an id in a text) are no integer orjson misread: such
    a line is not read twice (a regular expression over every line cost ten times the reading)."""
    import ragdb.storage.codec as codec

    def refuse(text):
        raise AssertionError("read again")

    monkeypatch.setattr(codec.json, "loads", refuse)
    text = '{"text": "order 12345678901234567890123", "n": [18446744073709551615, -9223372036854775808, 1e18]}'
    assert codec.loads_exact(text) == {"text": "order 12345678901234567890123",
                                       "n": [2 ** 64 - 1, -2 ** 63, 1e18]}
    monkeypatch.undo()
    assert loads_exact('{"f": [1e19], "n": {"m": 18446744073709551616}}') == {"f": [1e19], "n": {"m": 2 ** 64}}
