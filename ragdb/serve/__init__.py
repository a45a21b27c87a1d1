"""Serving one database: the HTTP API (``ragdb serve``), the MCP server (``ragdb mcp``), and
the JSON shapes they and the CLI share."""
