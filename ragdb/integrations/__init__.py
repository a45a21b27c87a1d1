"""Bridges from ragdb to the frameworks RAG applications are built with.

Each module is an optional extra and imports its framework on import:
:mod:`ragdb.integrations.mcp` (``pip install 'ragdb[mcp]'``) serves a database
to MCP clients (``ragdb mcp``).
"""
