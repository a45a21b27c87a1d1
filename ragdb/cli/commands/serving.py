"""Commands that serve a database to other programs: ``mcp`` (MCP clients, over stdio or
HTTP) and ``serve`` (the HTTP JSON API). Both need an optional extra: ragdb[mcp], ragdb[server]."""

from __future__ import annotations

import click

from ragdb.cli.options import (
    access_options,
    current_collection,
    database_option,
    db_path,
    open_database,
    principals_arg,
)
from ragdb.cli.main import one_line
from ragdb.cli.output import warn
from ragdb.errors import InvalidInput


# --------------------------------------------------------------------------- mcp


@click.command("mcp")
@database_option
@access_options
@click.option("--allow-writes", is_flag=True, help="Also offer the write tools (add_text, add_texts, update_document, delete) and the "
                   "collection tools (list_collections, create_collection, drop_collection).")
@click.option("--http", "http_address", default=None, metavar="HOST:PORT",
              help="Serve the Streamable HTTP transport (endpoint /mcp) on HOST:PORT instead of stdio; "
                   "a bare PORT binds 127.0.0.1.")
@click.option("--allow-remote", is_flag=True,
              help="Let --http bind a host other than loopback (the transport has no authentication).")
@click.option("--write-label", "write_labels", multiple=True, metavar="LABEL",
              help="Label what add_text/add_texts store with LABEL (repeatable; among the --principal labels). Default: "
                   "the --principal labels (none: public documents).")
@click.option("--max-query", "max_query", type=click.IntRange(1), default=4000, show_default=True,
              metavar="CHARS", help="Longest query or question a tool takes.")
def mcp_cmd(database: str | None, principals: tuple[str, ...], all_principals: bool, allow_writes: bool,
            http_address: str | None, allow_remote: bool, write_labels: tuple[str, ...], max_query: int) -> None:
    """Serve the database to MCP clients (assistants, agents) over stdio, or HTTP with --http.

    Tools: search, get_document, list_sources, build_prompt, facets, stats (and
    with --allow-writes add_text, add_texts, update_document, delete and the
    collection tools). The server reads as the --principal
    labels given here (anonymous without them: public documents only); no
    tool lets the model choose them. Needs 'pip install ragdb[mcp]'.

    \b
    Example (a desktop assistant's config launches this):
      ragdb mcp -d kb.db --principal team-docs
    """
    try:
        from ragdb.serve import mcp as mcp_server
    except ImportError as e:
        raise click.ClickException(f"ragdb mcp needs the mcp package ({one_line(e)}): "
                                   f"pip install 'ragdb[mcp]'") from None
    who = principals_arg(principals, all_principals)
    address = None
    if http_address is not None:
        try:
            address = mcp_server.parse_http_address(http_address)
        except InvalidInput as e:
            raise click.BadParameter(str(e), param_hint="--http") from None
        if not allow_remote and not mcp_server.is_loopback(address[0]):
            raise click.BadParameter(f"{address[0]} is not a loopback address and the MCP transport has no "
                                     f"authentication; add --allow-remote to serve it anyway",
                                     param_hint="--http")
    if allow_writes and click.get_current_context().find_root().params.get("readonly"):
        raise click.UsageError("--allow-writes cannot write a database opened with --readonly")
    with open_database(database) as db:
        if address is not None:
            host = f"[{address[0]}]" if ":" in address[0] else address[0]
            warn(f"serving MCP (Streamable HTTP) on http://{host}:{address[1]}/mcp")
        try:
            mcp_server.serve(db, principals=who, allow_writes=allow_writes, http=address,
                             write_labels=list(write_labels) or None, max_query_chars=max_query)
        except InvalidInput as e:
            raise click.UsageError(str(e)) from None


# --------------------------------------------------------------------------- serve

@click.command("serve")
@database_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port to bind.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Worker processes, each with its own connection to the database.")
@click.option("--tokens", "tokens_file", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="API tokens (JSON, or TOML): each token's principals and whether it may write (see README).")
@click.option("--allow-remote", is_flag=True, help="Let --host bind an address other than loopback.")
@click.option("--max-body", "max_body", type=click.IntRange(1), default=4 * 1024 * 1024, show_default=True,
              metavar="BYTES", help="Largest request body.")
@click.option("--max-k", "max_k", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Largest k of a search or prompt.")
@click.option("--max-query", "max_query", type=click.IntRange(1), default=4000, show_default=True,
              metavar="CHARS", help="Longest query or question.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A Host header name to answer (repeatable; '*': any). Default: the names of the bound "
                   "address (127.0.0.1, localhost, [::1] on loopback); other Host headers get 400, "
                   "against DNS rebinding.")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="A browser origin (https://app.example) allowed to call the API (repeatable; '*': any). "
                   "Default: none (CORS off).")
@click.option("--busy-timeout", type=click.FloatRange(0, 3600), default=30.0, show_default=True,
              metavar="SECONDS", help="How long a write waits for another writer before answering 503.")
@click.option("--header-timeout", type=click.FloatRange(0.1, 3600), default=10.0, show_default=True,
              metavar="SECONDS", help="Close a connection that has not sent a request's headers within this "
                                      "(idle or trickling connections).")
@click.option("--body-timeout", type=click.FloatRange(0.1, 3600), default=30.0, show_default=True,
              metavar="SECONDS", help="Answer 408 to a request whose body has not arrived within this.")
@click.option("--keep-alive", type=click.IntRange(1, 3600), default=5, show_default=True, metavar="SECONDS",
              help="Close an idle keep-alive connection after this.")
@click.option("--max-connections", type=click.IntRange(1, 100_000), default=512, show_default=True,
              help="Connections and requests in progress per worker; past that, 503.")
@click.option("--collections", "all_collections", is_flag=True,
              help="Serve every collection of the database under /collections/NAME/ (the administrator's token "
                   "creates and drops them); default: only the one opened (--collection).")
@click.option("--access-log", is_flag=True, help="Log every request on stderr.")
def serve_cmd(database: str | None, host: str, port: int, workers: int, tokens_file: str | None,
              allow_remote: bool, max_body: int, max_k: int, max_query: int, allowed_hosts: tuple[str, ...],
              cors_origins: tuple[str, ...], busy_timeout: float, header_timeout: float, body_timeout: float,
              keep_alive: int, max_connections: int, all_collections: bool, access_log: bool) -> None:
    """Serve the database over HTTP (a JSON API; schema at /openapi.json).

    Reads (POST /search, POST /prompt, GET /documents, /documents/ID, /stats,
    /healthz) without a token are anonymous: public documents only. A bearer
    token reads as its principals; writes (POST /documents, DELETE
    /documents/ID, POST /documents/delete) need a token allowed to write: $RAGDB_API_TOKEN (reads
    everything) or a --tokens entry. Needs 'pip install ragdb[server]'.

    \b
    Example:
      RAGDB_API_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))') \\
        ragdb serve -d kb.db --workers 2
    """
    try:
        from ragdb.serve import http_api as server
    except ImportError as e:
        raise click.ClickException(f"ragdb serve needs starlette and uvicorn ({one_line(e)}): "
                                   f"pip install 'ragdb[server]'") from None
    if not allow_remote and not server.is_loopback(host):
        raise click.BadParameter(f"{host} is not a loopback address: add --allow-remote to serve other machines "
                                 f"(put TLS in front of it: bearer tokens travel in the clear)", param_hint="--host")
    readonly = bool(click.get_current_context().find_root().params.get("readonly"))
    if db_path(database) == ":memory:":
        raise click.UsageError("ragdb serve needs a database file: each worker opens it (':memory:' would be "
                               "an empty database of its own)")
    open_database(database).close()  # exists, and is a ragdb database
    for name in allowed_hosts:
        if not name or any(c.isspace() or c in "/@" for c in name) or ("*" in name and name != "*"
                                                                        and not name.startswith("*.")):
            raise click.BadParameter(f"{name!r} is not a host name ('*', 'example.com', '*.example.com')",
                                     param_hint="--allowed-host")
    limits = server.Limits(max_body_bytes=max_body, max_k=max_k, max_query_chars=max_query,
                           header_timeout=header_timeout, body_timeout=body_timeout, keep_alive=keep_alive,
                           max_connections=max_connections)
    config = server.ServerConfig(database=db_path(database), readonly=readonly, tokens_file=tokens_file,
                                 collection=current_collection(), limits=limits,
                                 allowed_hosts=tuple(h.lower() for h in allowed_hosts)
                                 or server.default_allowed_hosts(host),
                                 cors_origins=cors_origins, busy_timeout=busy_timeout,
                                 collections=all_collections)
    tokens = server.check_config(config)
    writers = sum(1 for g in tokens.values() if g.write)
    shown = f"[{host}]" if ":" in host else host
    warn(f"serving ragdb on http://{shown}:{port} ({workers} worker{'s' if workers > 1 else ''}; "
         f"{len(tokens)} token{'s' if len(tokens) != 1 else ''}, writes "
         f"{'off' if readonly or not writers else f'by {writers} token' + ('s' if writers > 1 else '')})")
    server.run(config, host=host, port=port, workers=workers, access_log=access_log)


#: The commands of this module (:mod:`ragdb.cli.main` adds them to the ``ragdb`` group).
COMMANDS: tuple[click.Command, ...] = (mcp_cmd, serve_cmd)
