"""Integrations of ragdb with the frameworks RAG applications are built with.

Each is an optional extra and its own module, imported on demand (``import ragdb``
imports none of them): :mod:`ragdb.integrations.langchain`
(``pip install 'ragdb[langchain]'``) and :mod:`ragdb.integrations.llama_index`
(``pip install 'ragdb[llama-index]'``) give retrievers, add paths and vector stores
(``RagdbVectorStore``; what both share is :mod:`ragdb.integrations.stores`). Importing one
without its framework installed raises :class:`ragdb.errors.MissingDependency`
naming the extra. The MCP server (``ragdb mcp``) is :mod:`ragdb.serve.mcp`, beside the HTTP API.
"""
