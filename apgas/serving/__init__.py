"""What a server or daemon built next to the runtime needs: the scheduler's, and yours.

Line-based connections that one client cannot flood or starve (bounded reads, a
share of the server per peer, logs that escape what a peer sends), who a local
peer is, files and directories nobody else can change, and one self-contained
HTML page from a view model (the dashboard, the reports, the timeline). None of it
needs a running runtime.
"""

from __future__ import annotations

from launcher._trusted_paths import (
    UntrustedPath,
    make_trusted_dir,
    open_append,
    open_new_file,
    owner_name,
    read_trusted,
    trusted_dir,
    trusted_file,
    trusted_location,
)

from ._complaints import LOG_TEXT, PeerLog, loggable
from ._connections import (
    LineTooLong,
    connection_peer,
    discard_rest,
    read_head,
    read_line,
    serve_connections,
)
from ._peers import peer_is_local, peer_key, peer_uid
from ._webview import CONTENT_SECURITY_POLICY, render_page

__all__ = [
    # line-based servers: one thread a connection, bounded lines
    "serve_connections", "read_line", "discard_rest", "LineTooLong",
    # fair service: who a peer is, its share of a server, logs it cannot flood
    "peer_uid", "peer_key", "peer_is_local", "read_head", "connection_peer", "PeerLog",
    "loggable", "LOG_TEXT",
    # one self-contained HTML page from a view model
    "render_page", "CONTENT_SECURITY_POLICY",
    # files and directories a daemon may trust (nobody else can change them)
    "UntrustedPath", "trusted_dir", "trusted_file", "trusted_location", "make_trusted_dir",
    "open_new_file", "open_append", "read_trusted", "owner_name",
]
