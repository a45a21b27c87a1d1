"""Compressed document text (SQLite): ``documents.text`` and ``chunks.text`` hold a text
either as TEXT (every database written before migration 0010, and texts too short to gain)
or as a BLOB, one zstd frame of the text's UTF-8.

Each collection trains a zstd dictionary from its first texts (:func:`train`): a text of a
few KiB compresses to ~40% with one (52% without, on the realistic benchmark corpus).
Dictionaries are kept in the file-wide table ``text_dictionaries``; each has an id unique in
the file, written into the dictionary and so into each frame's header, so a frame names the
dictionary that decodes it (id 0: none) and a reader of any collection decodes any frame.
A dictionary is written in the same transaction as the first texts compressed with it, so a
reader that sees a text sees its dictionary.

Why ``zstandard`` (python-zstandard) rather than pyzstd / ``compression.zstd``: its
decompressor keeps its context (and the digested dictionary) between calls, so a hit's text
decodes in ~3.5 us where ``compression.zstd.decompress`` made a fresh context each call
(~7.5 us): a search at k=100 decodes 100 texts.

PostgreSQL stores plain text (TOAST already compresses values over 2 KB); the read paths
the backends share pass a ``str`` through :meth:`TextCodec.decode` unchanged.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import zstandard

from ragdb.errors import TextDamaged
from ragdb.storage.codec import utcnow_iso

if TYPE_CHECKING:  # (imported where a bulk load starts its thread: a search never needs it, ~10 ms)
    from concurrent.futures import Future, ThreadPoolExecutor

#: zstd level: 3 (zstd's default) compresses a 1.4 KiB text in ~12 us; 7 saves 5% more in ~4x the time
LEVEL = 3
#: dictionary size: 64 KiB gave 0.400 of the raw size on the realistic corpus, 112 KiB 0.398
DICT_SIZE = 64 << 10
#: a collection trains its dictionary once it has this many texts of this much text in all
#: (zstd wants on the order of 100x the dictionary size in samples; fewer gives a weaker one)
TRAIN_MIN_TEXTS = 256
TRAIN_MIN_BYTES = 1 << 20
#: at most this many texts (spread over the candidates) and bytes go into training (~0.5 s)
TRAIN_MAX_TEXTS = 4000
TRAIN_MAX_BYTES = 16 << 20
#: texts shorter than this many UTF-8 bytes stay TEXT (a frame's header alone is 6-10 bytes)
MIN_BYTES = 64
#: the ids of dictionaries start here (zstd leaves 1..32767 to a registry)
FIRST_DICT_ID = 32768
#: a collection without a dictionary tries to train one whenever a document id is a multiple of this
TRAIN_EVERY = 1024

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame's first bytes (never the start of valid UTF-8)

DICT_TABLE = "text_dictionaries"


class TextCodec:
    """A connection's compressors and decompressors, by dictionary id; dictionaries are
    loaded from the database when a frame names one not seen yet (``load``)."""

    def __init__(self, load: Callable[[int], bytes | None]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._dicts: dict[int, zstandard.ZstdCompressionDict] = {}
        self._decompressors: dict[int, zstandard.ZstdDecompressor] = {}
        self._compressors: dict[int, zstandard.ZstdCompressor] = {}
        self._ahead: list[AheadCompression] = []  # bulk loads compressing ahead of their writes (ahead())

    def _dict(self, dict_id: int) -> zstandard.ZstdCompressionDict:
        d = self._dicts.get(dict_id)
        if d is None:
            content = self._load(dict_id)
            if content is None:
                raise TextDamaged(f"a stored text names zstd dictionary {dict_id}, which the database does not have")
            d = zstandard.ZstdCompressionDict(content, dict_type=zstandard.DICT_TYPE_FULLDICT)
            self._dicts[dict_id] = d
        return d

    def add_dict(self, dict_id: int, content: bytes) -> None:
        """A dictionary this connection just stored (no need to read it back)."""
        self._dicts[dict_id] = zstandard.ZstdCompressionDict(content, dict_type=zstandard.DICT_TYPE_FULLDICT)

    def forget(self) -> None:
        """Drop the cached dictionaries (after a rollback that may have undone one's row)."""
        with self._lock:
            self._dicts.clear()
            self._decompressors.clear()
            self._compressors.clear()
            for session in self._ahead:
                session.drop()  # (made with a dictionary that may be gone)

    # -- reading -------------------------------------------------------------------------
    def _frame(self, blob: bytes) -> bytes:
        """The UTF-8 bytes of one stored zstd frame, the caller holding the lock (a zstandard
        (de)compressor must not be used by two threads at once); :class:`TextDamaged` when it
        is not a frame this database can decode."""
        if blob[:4] != ZSTD_MAGIC:
            raise TextDamaged("a stored text is a BLOB that is not a zstd frame")
        try:
            dict_id = zstandard.get_frame_parameters(blob).dict_id
            dec = self._decompressors.get(dict_id)
            if dec is None:
                dec = (zstandard.ZstdDecompressor() if dict_id == 0
                       else zstandard.ZstdDecompressor(dict_data=self._dict(dict_id)))
                self._decompressors[dict_id] = dec
            return dec.decompress(blob)
        except (zstandard.ZstdError, MemoryError, ValueError, OverflowError) as e:
            raise TextDamaged(f"a stored text's zstd frame is damaged ({e})") from None

    @staticmethod
    def _utf8(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TextDamaged(f"a stored text decompresses to bytes that are not UTF-8 (byte {e.start})") from None

    def decode_bytes(self, blob: bytes) -> bytes:
        """The UTF-8 bytes a stored BLOB holds; :class:`TextDamaged` when it is not a frame
        this database can decode."""
        with self._lock:
            return self._frame(blob)

    def decode(self, value: str | bytes | None) -> str | None:
        """A stored text: TEXT as it is, a BLOB decompressed."""
        if value is None or isinstance(value, str):
            return value
        return self._utf8(self.decode_bytes(value))

    def decode_many(self, values: Sequence[str | bytes | None]) -> list[str | None]:
        """:meth:`decode` of each of ``values``, in order: the texts of a search's hits, read
        together under one hold of the lock, taken at the first BLOB (none for values that are
        all TEXT, as PostgreSQL's always are); ~1 us a text less than one call each."""
        out: list[str | None] = []
        append = out.append
        held = False
        try:
            for value in values:
                if value is None or isinstance(value, str):
                    append(value)
                    continue
                if not held:
                    self._lock.acquire()
                    held = True
                append(self._utf8(self._frame(value)))
        finally:
            if held:
                self._lock.release()
        return out

    # -- writing -------------------------------------------------------------------------
    def encode(self, text: str | None, dict_id: int) -> str | bytes | None:
        """What to store for ``text``: a zstd frame (with dictionary ``dict_id``, 0: none) when
        that is shorter than its UTF-8, else the text as it is."""
        if text is None:
            return None
        raw = text.encode("utf-8")
        if len(raw) < MIN_BYTES:
            return text
        if self._ahead:
            found = self._made_ahead(text, dict_id)
            if found is not None:
                return found
        with self._lock:
            comp = self._compressors.get(dict_id)
            if comp is None:
                comp = (zstandard.ZstdCompressor(level=LEVEL) if dict_id == 0 else
                        zstandard.ZstdCompressor(level=LEVEL, dict_data=self._dict(dict_id)))
                self._compressors[dict_id] = comp
            frame = comp.compress(raw)
        return _shorter(text, raw, frame)

    # -- compressing ahead of a write ----------------------------------------------------------
    def ahead(self) -> AheadCompression:
        """A bulk load's head start on compressing its texts: see :class:`AheadCompression`
        (:meth:`encode` takes what it made; close it when the load is over)."""
        session = AheadCompression(self._dict, self._end)
        with self._lock:
            self._ahead = [*self._ahead, session]  # (replaced, not changed in place: encode reads it without the lock)
        return session

    def _end(self, session: AheadCompression) -> None:
        with self._lock:
            self._ahead = [s for s in self._ahead if s is not session]

    def _made_ahead(self, text: str, dict_id: int) -> str | bytes | None:
        """What a session made for ``text`` with dictionary ``dict_id`` (the dictionary object
        this codec holds for that id: one trained again under the same id after a rollback is
        another), or None."""
        zdict = self._dicts.get(dict_id)
        for session in self._ahead:
            found = session.made(text, dict_id, zdict)
            if found is not None:
                return found
        return None


class AheadCompression:
    """Texts compressed in a background thread before the write that stores them, for
    :meth:`TextCodec.encode` to take then: the same values (a compressor of the same level
    and dictionary, each batch its own, as a zstd compressor serves one thread at a time).

    zstd releases the GIL while it compresses, so the frames are made on another core while
    the load's thread goes on: ``Database.add_many`` hands over each batch while it writes the
    one before (its main thread spent ~8% of a 100k-chunk load compressing). The last two
    batches handed over are held (texts never written drop out with them); :meth:`close`
    stops the thread. One per load: loads in other threads (other collections of one
    connection share its codec) have their own."""

    def __init__(self, dictionary: Callable[[int], zstandard.ZstdCompressionDict],
                 on_close: Callable[[AheadCompression], None]) -> None:
        self._dictionary = dictionary  # (the codec's: the same object its encode compares with)
        self._on_close = on_close
        self._jobs: list[_Ahead] = []  # replaced whole, never changed in place (read without a lock)
        self._thread: ThreadPoolExecutor | None = None

    def submit(self, texts: Sequence[str], dict_id: int) -> None:
        """Start compressing ``texts`` with dictionary ``dict_id`` (not 0)."""
        zdict = self._dictionary(dict_id)
        comp = zstandard.ZstdCompressor(level=LEVEL, dict_data=zdict)
        if self._thread is None:
            from concurrent.futures import ThreadPoolExecutor

            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragdb-zstd")
        listed = list(texts)
        # (the set, made here, is what a lookup asks first: only the job holding a text is waited for)
        job = _Ahead(dict_id, zdict, frozenset(listed), self._thread.submit(_stored_all, comp, listed))
        self._jobs = [*self._jobs[-1:], job]

    def made(self, text: str, dict_id: int, zdict: zstandard.ZstdCompressionDict | None
             ) -> str | bytes | None:
        for job in self._jobs:
            if job.dict_id == dict_id and job.zdict is zdict and text in job.texts:
                try:
                    return job.future.result().get(text)
                except Exception:  # (the thread failed, e.g. out of memory: compressed in the write instead)
                    return None
        return None

    def drop(self) -> None:
        """Forget what was made (a rollback: made with a dictionary that may be gone)."""
        self._jobs = []

    def close(self) -> None:
        """Stop the thread (waiting for the batch it is on) and forget what was made."""
        self._on_close(self)
        self._jobs = []
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True, cancel_futures=True)


class _Ahead:
    """A batch's texts being compressed ahead of their write: text -> what to store, when done."""

    __slots__ = ("dict_id", "zdict", "texts", "future")

    def __init__(self, dict_id: int, zdict: zstandard.ZstdCompressionDict, texts: frozenset[str],
                 future: Future[dict[str, str | bytes]]) -> None:
        self.dict_id = dict_id
        self.zdict = zdict
        self.texts = texts
        self.future = future


#: Whether python-zstandard's backend offers ``ZstdCompressor.multi_compress_to_buffer``: its C
#: backend does; its cffi backend (``PYTHON_ZSTANDARD_IMPORT_POLICY=cffi``, or platforms without
#: the C extension) lacks it, so there :func:`_stored_all` makes one ``compress`` call a text.
#: Both paths are complete and tested (tests/storage/test_compressed_text.py runs a load on each).
MULTI_COMPRESS = zstandard.backend != "cffi"


def _shorter(text: str, raw: bytes, frame: bytes) -> str | bytes:
    """What to store for ``text`` (UTF-8 ``raw``) given its zstd ``frame``: the frame when that
    is shorter, else the text as it is."""
    return frame if len(frame) < len(raw) else text


def _stored_all(comp: zstandard.ZstdCompressor, texts: list[str]) -> dict[str, str | bytes]:
    """text -> what :meth:`TextCodec.encode` stores for it, for each of ``texts`` (in a background thread).

    The frames are made in one call, which holds no GIL from the first to the last: a call a
    text took the GIL back after each, and a thread waits up to the switch interval (5 ms) for
    it while the writer's thread runs Python, so the batch was not done when its write came.
    The same frames as ``encode``'s (tested); one call a text where the backend has no
    such call (:data:`MULTI_COMPRESS`)."""
    out: dict[str, str | bytes] = {t: t for t in texts}
    raws = [t.encode("utf-8") for t in texts]
    big = [i for i, raw in enumerate(raws) if len(raw) >= MIN_BYTES]
    if not big:
        return out
    if MULTI_COMPRESS:
        made = comp.multi_compress_to_buffer([raws[i] for i in big], threads=1)
        frames = [made[j].tobytes() for j in range(len(big))]
    else:
        frames = [comp.compress(raws[i]) for i in big]
    for i, frame in zip(big, frames):
        out[texts[i]] = _shorter(texts[i], raws[i], frame)
    return out


def new_codec(conn: sqlite3.Connection) -> TextCodec:
    """The codec of a SQLite connection (dictionaries read from its file-wide table)."""

    def load(dict_id: int) -> bytes | None:
        try:
            row = conn.execute(f"SELECT content FROM {DICT_TABLE} WHERE id = ?", [dict_id]).fetchone()
        except sqlite3.OperationalError:  # no such table: a database before migration 0010
            return None
        return bytes(row[0]) if row is not None and isinstance(row[0], bytes) else None

    return TextCodec(load)


def current_dict(conn: sqlite3.Connection, collection_id: int) -> int:
    """The id of collection ``collection_id``'s newest dictionary, 0 when it has none."""
    row = conn.execute(f"SELECT max(id) FROM {DICT_TABLE} WHERE collection_id = ?", [collection_id]).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def train(conn: sqlite3.Connection, codec: TextCodec, collection_id: int, texts: Sequence[str]) -> int:
    """Train and store a dictionary for collection ``collection_id`` from ``texts`` (inside
    the caller's write transaction) when they are enough; returns its id, or 0 (too few)."""
    samples = [t.encode("utf-8") for t in texts if t]
    if len(samples) < TRAIN_MIN_TEXTS or sum(map(len, samples)) < TRAIN_MIN_BYTES:
        return 0
    if len(samples) > TRAIN_MAX_TEXTS:  # spread over all of them, not only the first
        step = len(samples) / TRAIN_MAX_TEXTS
        samples = [samples[int(i * step)] for i in range(TRAIN_MAX_TEXTS)]
    picked: list[bytes | bytearray | memoryview] = []
    held = 0
    for s in samples:
        if held + len(s) > TRAIN_MAX_BYTES:
            break
        picked.append(s)
        held += len(s)
    row = conn.execute(f"SELECT max(id) FROM {DICT_TABLE}").fetchone()
    dict_id = max(FIRST_DICT_ID, int(row[0] or 0) + 1)
    try:
        content = zstandard.train_dictionary(DICT_SIZE, picked, dict_id=dict_id, level=LEVEL).as_bytes()
    except zstandard.ZstdError:  # too little variety to train on: go on without a dictionary
        return 0
    conn.execute(f"INSERT INTO {DICT_TABLE} (id, collection_id, created_at, content) VALUES (?, ?, ?, ?)",
                 [dict_id, collection_id, utcnow_iso(), content])
    codec.add_dict(dict_id, content)
    return dict_id


def register_functions(conn: sqlite3.Connection, codec: TextCodec) -> None:
    """The SQL functions that read stored text on ``conn``:

    ``ragdb_instr(text, needle)``: ``instr`` on the decoded text, for ``> 0`` (a ``$contains`` filter);
    ``ragdb_text_bytes(typeof(x), CAST(x AS BLOB))``: a text's UTF-8 bytes (``check``'s vector
    hashes), NULL when a frame is damaged (``check`` reports the text itself)."""

    needles: dict[str, bytes] = {}

    def instr(text: str | bytes | None, needle: str | None) -> int | None:
        if text is None or needle is None:
            return None
        if isinstance(text, str):
            return text.find(needle) + 1
        # A frame: its UTF-8 bytes searched for the needle's (UTF-8 is self-synchronizing, so
        # a byte match is a character match), without decoding to str: a $contains scan
        # decodes every candidate's text. Only ``> 0`` is ever asked, so 1 stands for any position.
        b = needles.get(needle)
        if b is None:
            if len(needles) > 64:
                needles.clear()
            b = needles[needle] = needle.encode("utf-8")
        return 1 if b in codec.decode_bytes(text) else 0

    def text_bytes(kind: str, raw: bytes | None) -> bytes | None:
        if raw is None or kind != "blob":
            return raw
        try:
            return codec.decode_bytes(raw)
        except TextDamaged:
            return None

    conn.create_function("ragdb_instr", 2, instr, deterministic=True)
    conn.create_function("ragdb_text_bytes", 2, text_bytes, deterministic=True)


def pack(conn: sqlite3.Connection, codec: TextCodec, collection_id: int, texts: Sequence[str | None],
         doc_ids: Sequence[int] = (), stored: Callable[[], list[str]] | None = None) -> list[str | bytes | None]:
    """What to store for each of ``texts`` (inside the caller's write transaction), compressed
    with the collection's dictionary. A collection without one trains it from these texts when
    they are enough (:func:`train`), or else, when ``doc_ids`` pass a multiple of
    :data:`TRAIN_EVERY`, from them and ``stored()`` (texts already stored): a database filled one
    document at a time gets its dictionary too."""
    if all(t is None for t in texts):  # chunks that are their whole document store no text of their own
        return list(texts)
    dict_id = current_dict(conn, collection_id)
    if dict_id == 0 and doc_ids:
        fresh = [t for t in texts if t]
        dict_id = train(conn, codec, collection_id, fresh)
        if dict_id == 0 and stored is not None and (min(doc_ids) - 1) // TRAIN_EVERY != max(doc_ids) // TRAIN_EVERY:
            dict_id = train(conn, codec, collection_id, stored() + fresh)
    return [codec.encode(t, dict_id) for t in texts]


def compress_stored(conn: sqlite3.Connection, collection_ids: Sequence[int]) -> None:
    """Migration 0010's step: train each collection's dictionary from its stored document
    texts and compress every stored text (documents and chunks) that gains by it. A value that
    is not valid UTF-8 TEXT is left as it is, for ``check`` to report."""
    from ragdb.storage.collections import object_name

    codec = new_codec(conn)
    for cid in collection_ids:
        docs, chunks = object_name(cid, "documents"), object_name(cid, "chunks")
        n, low = conn.execute(f"SELECT count(*), coalesce(min(id), 0) FROM {docs}").fetchone()
        if not n:
            continue
        step = max(1, n // TRAIN_MAX_TEXTS)
        sample = [_utf8(raw) for kind, raw in conn.execute(
            f"SELECT typeof(text), CAST(text AS BLOB) FROM {docs} WHERE (id - ?) % ? = 0 LIMIT ?",
            [low, step, TRAIN_MAX_TEXTS]) if kind == "text"]
        dict_id = train(conn, codec, cid, [t for t in sample if t])
        for table in (docs, chunks):
            after = 0
            while rows := conn.execute(
                    f"SELECT id, CAST(text AS BLOB) FROM {table} WHERE id > ? AND typeof(text) = 'text' "
                    f"ORDER BY id LIMIT 2048", [after]).fetchall():
                after = rows[-1][0]
                updates = []
                for rid, raw in rows:
                    text = _utf8(raw)
                    packed = codec.encode(text, dict_id) if text is not None else None
                    if isinstance(packed, bytes):
                        updates.append((packed, rid))
                conn.executemany(f"UPDATE {table} SET text = ? WHERE id = ?", updates)


def _utf8(raw: bytes | None) -> str | None:
    try:
        return None if raw is None else bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return None
