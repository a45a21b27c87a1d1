"""The chunk-state snapshot: an open handle's per-chunk arrays as of the last flush.

Opening a handle needs every chunk's length, document, state (latest, old version,
absent) and whether it is its whole document (:class:`ragdb.index.inverted.Index`).
Read from the chunk rows, that is one row a chunk: ~100 ms at 100k chunks, ~1 s at a
million, paid by every CLI command and every server process that opens the database.

So each flush also writes those arrays, as of the flush, into the ``chunk_state`` table
(one row, tagged with the flush it belongs to: ``stats.flush_count`` and
``stats.flushed_upto``). A handle opening reads it, then the chunk rows after
``flushed_upto`` (the unflushed tail, read anyway) and the change log since the flush
(``chunk_log``: every state change of a chunk is logged there until the next flush), and
holds exactly what a scan of every row would give. A snapshot of another flush (a reindex,
a migration, a copy that did not carry it) is not used: the rows are scanned as before.
``check()`` compares the two ways.

The body: a 16-byte header (magic, format, number of chunk ids n), then one zstd frame of
n uint32 lengths, n int64 document-id gaps (a chunk's document id minus the previous
chunk id's; wrapping) and n uint8 flags (state | whole << 2). Chunk ids are dense and a
document's chunks are consecutive, so the gaps are mostly 0 and 1 and the frame is small
(~1-2 bytes a chunk); an absent chunk id stores zeros, as the view holds them.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import zstandard

MAGIC = b"RCS1"
_HEADER = struct.Struct("<4sIQ")  # magic, format (1), n
FORMAT = 1
LEVEL = 1  # zstd level: the arrays compress well at once; higher levels cost the flush more
_WIDTH = 4 + 8 + 1  # bytes a chunk id in the frame


class ChunkState(NamedTuple):
    """Per chunk id 0..n-1: length, state (``ragdb.index.inverted`` ABSENT/LATEST/OLD), document id, whole."""

    lengths: np.ndarray  # uint32
    state: np.ndarray  # int8
    chunk_doc: np.ndarray  # int64
    whole: np.ndarray  # bool


def encode(lengths: np.ndarray, state: np.ndarray, chunk_doc: np.ndarray, whole: np.ndarray, n: int) -> bytes:
    """The snapshot body of chunk ids ``0..n-1`` of these arrays (an absent id stores zeros)."""
    st = state[:n].astype(np.uint8)
    present = st != 0
    ln = np.where(present, lengths[:n], 0)
    if len(ln) and (ln.min() < 0 or ln.max() >= 2**32):
        raise ValueError("a chunk length outside uint32")
    docs = np.where(present, chunk_doc[:n], 0).astype(np.int64)
    gaps = np.diff(docs, prepend=np.int64(0))
    flags = st | (np.where(present, whole[:n], False).astype(np.uint8) << 2)
    frame = b"".join((ln.astype("<u4").tobytes(), gaps.astype("<i8").tobytes(), flags.tobytes()))
    return _HEADER.pack(MAGIC, FORMAT, n) + zstandard.ZstdCompressor(level=LEVEL).compress(frame)


def decode(body: bytes) -> ChunkState:
    """The arrays of a snapshot body; ``ValueError`` if it is not a whole, valid one."""
    if not isinstance(body, (bytes, bytearray, memoryview)) or len(body) < _HEADER.size:
        raise ValueError("not a chunk-state snapshot")
    magic, fmt, n = _HEADER.unpack_from(body)
    if magic != MAGIC or fmt != FORMAT or n > 2**40:
        raise ValueError("not a chunk-state snapshot of this format")
    payload = bytes(body[_HEADER.size:])
    try:
        if zstandard.get_frame_parameters(payload).content_size != n * _WIDTH:  # (before allocating it)
            raise ValueError(f"a chunk-state snapshot whose frame is not {n} chunk ids")
        frame = zstandard.ZstdDecompressor().decompress(payload)
    except zstandard.ZstdError as e:
        raise ValueError(f"a damaged chunk-state snapshot: {e}") from None
    if len(frame) != n * _WIDTH:
        raise ValueError(f"a chunk-state snapshot of {len(frame)} bytes for {n} chunk ids")
    lengths = np.frombuffer(frame, "<u4", n).astype(np.uint32)
    docs = np.cumsum(np.frombuffer(frame, "<i8", n, 4 * n), dtype=np.int64)
    flags = np.frombuffer(frame, np.uint8, n, 12 * n)
    state = flags & 3
    if n and (state.max() > 2 or flags.max() > 7):
        raise ValueError("a chunk-state snapshot with an unknown chunk state")
    return ChunkState(lengths, state.astype(np.int8), docs, (flags & 4).astype(bool))
