"""Our policies inside ElastiSim, the batch-system simulator of the MEBF study:
``apgas-scheduler elastisim --policy NAME`` speaks its ZeroMQ protocol
(:mod:`.bridge`). A part of its own: it uses the policies and the engine, and
no other part uses it."""

from .bridge import (
    DEFAULT_URL,
    DESCRIPTION,
    FINALIZE,
    HELP,
    INVOKE_SCHEDULING,
    MAX_MESSAGE,
    NODE_SPEED,
    SCHEDULED,
    Bridge,
    ProtocolError,
    add_arguments,
    main,
    serve,
)

__all__ = [
    "DEFAULT_URL", "MAX_MESSAGE", "NODE_SPEED", "INVOKE_SCHEDULING", "SCHEDULED", "FINALIZE",
    "ProtocolError", "Bridge", "serve", "add_arguments", "main", "HELP", "DESCRIPTION"
]
