"""A client of a ``ragdb serve`` server with the reading and writing methods of
:class:`ragdb.Database` and the same result types: ``ragdb.connect(url, token=...)``.

An application moves from a file to a server by changing the one line that opens
it (``ragdb.open(path)`` becomes ``ragdb.connect(url, token=...)``); see
:mod:`ragdb.client.remote` for what differs.
"""

from __future__ import annotations

from ragdb.client.remote import Client, connect

__all__ = ["Client", "connect"]
