"""Who is at the other end of a connection, as the kernel tells it.

Servers share their slots per peer (:mod:`._serving`) and clients refuse a
port squatted by another user, so both need the peer's user, not its word.
Over a Unix socket the kernel gives it (``SO_PEERCRED``). Over TCP within this
machine (loopback, or the peer's address is the connection's own) the other
end is a socket of this machine too, and the kernel's socket table names its
owner: the socket whose local address is our peer and whose remote address is
us. That works from both ends: a server learns its client's uid, a client its
server's. A remote host's user is unknown; its key is its address.

The table is asked by an exact ``sock_diag`` netlink lookup (a hash lookup, a
few microseconds), else read from ``/proc/net/tcp`` (``tcp6``), whose reading
walks the whole table (about 2 ms with 1,200 sockets, and more for each
socket anyone opens): a cost every accepted connection would pay. So once
sock_diag is seen to find this machine's connections (:func:`_diag_finds`),
its answer is final: the table is read only for a half-open connection
(``SYN_RECV``, which sock_diag lists without an owner and the table under its
listener's). Else every connection whose peer hung up before it was accepted
(its end in ``TIME_WAIT``) would cost a reading of the whole table, in the
accept loop, ahead of everyone queued behind it; and a flood that was just cut
leaves hundreds of those, and tens of thousands of ``TIME_WAIT`` entries.

An entry without a socket file (inode 0) that says uid 0 names nobody: a
``TIME_WAIT`` leftover, a half-open connection, or, on kernels before the
socket's own uid was listed, a socket not yet accepted or already closed. It
gives None, so that a peer never passes for root by hanging up early.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from launcher._digits import ascii_int

__all__ = ["peer_uid", "peer_key", "peer_is_local"]

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address

_UCRED = struct.Struct("3i")  # pid, uid, gid
_WORD = struct.Struct("=I")  # /proc/net/tcp* print addresses as native-order 32-bit words
# sock_diag (linux/inet_diag.h): nlmsghdr, inet_diag_req_v2 with its inet_diag_sockid
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST = 4, 20, 1
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_SOCKID = struct.Struct("!HH16s16s")  # source port and address, destination's (network order)
_SOCKID_TAIL = struct.Struct("=III")  # interface, cookie (none: all ones)
_MSG_PORTS = struct.Struct("!HH")  # inet_diag_msg: after family, state, timer, retransmits
_MSG_OWNER = struct.Struct("=II")  # uid, inode: after the sockid, expires and the queues
_MSG_SIZE = 72
_SYN_RECV = 3  # a half-open connection's state (linux/tcp_states.h)


def peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the other end of ``conn``; None when this machine cannot tell
    (a remote host, a connection gone, an entry naming nobody)."""
    try:
        if conn.family == socket.AF_UNIX:
            uid: int = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     _UCRED.size))[1]
            return uid if uid >= 0 else None
        if conn.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        peer, local = conn.getpeername(), conn.getsockname()
    except OSError:
        return None
    peer_ip, local_ip = _address(peer[0]), _address(local[0])
    if not _local(peer_ip, local_ip):
        return None
    ends = (peer_ip, peer[1], local_ip, local[1])
    try:
        entry = _diag_entry(*ends)
    except OSError:  # no netlink here: the table it is
        return _proc_owner(*ends)
    if entry is None:
        # no such socket, or no TCP sock_diag in this kernel (ENOENT both): only then look
        return None if _diag_finds() else _proc_owner(*ends)
    state, uid, inode = entry
    if state == _SYN_RECV:  # half-open: the table names the listener, sock_diag nobody
        return _proc_owner(*ends)
    return _owner(uid, inode)  # what the table would say, without walking it


def peer_is_local(conn: socket.socket) -> bool:
    """Whether the other end of ``conn`` is on this machine (a Unix socket, a loopback
    address, or the connection's own address), where :func:`peer_uid` looks.

    There, None from :func:`peer_uid` means "not known (yet)", not "another
    machine": a client must not take it for a trusted server. Older kernels
    name no owner until the other end is accepted, so asking again shortly
    after tells."""
    if conn.family == socket.AF_UNIX:
        return True
    try:
        peer, local = conn.getpeername(), conn.getsockname()
    except OSError:
        return False
    return conn.family in (socket.AF_INET, socket.AF_INET6) and _local(_address(peer[0]),
                                                                        _address(local[0]))


def _local(peer: _IP, local: _IP) -> bool:
    return peer.version == local.version and (peer.is_loopback or peer == local)


def peer_key(conn: socket.socket) -> str:
    """``"uid N"`` when :func:`peer_uid` knows the peer's user, else ``"ip ADDRESS"``
    (an IPv4 peer of a dual-stack socket by its IPv4 address)."""
    uid = peer_uid(conn)
    if uid is not None:
        return f"uid {uid}"
    try:
        name = conn.getpeername()
    except OSError:
        return "ip ?"
    if not isinstance(name, tuple):
        return "ip ?"  # a Unix socket whose peer has no credentials
    return f"ip {_address(name[0])}"


def _address(text: str) -> _IP:
    """An IP address; a v4-mapped IPv6 one as its IPv4 address; without its scope."""
    ip = ipaddress.ip_address(text.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _owner(uid: int, inode: int) -> int | None:
    return None if uid == 0 and inode == 0 else uid


def _diag_owner(peer: _IP, peer_port: int, local: _IP, local_port: int) -> int | None:
    """The owner by an exact sock_diag lookup; None if not found or not to be had.

    An IPv4 query finds a dual-stack IPv6 socket's v4-mapped connection too."""
    try:
        entry = _diag_entry(peer, peer_port, local, local_port)
    except OSError:
        return None
    return None if entry is None else _owner(entry[1], entry[2])


def _diag_entry(peer: _IP, peer_port: int, local: _IP, local_port: int
                ) -> tuple[int, int, int] | None:
    """The TCP state, uid and inode of the socket bound to ``peer``:``peer_port`` and
    connected to ``local``:``local_port``, by an exact sock_diag lookup; None if
    there is no such socket (or the kernel has no TCP sock_diag: the same ENOENT);
    OSError if there is no netlink here."""
    family = socket.AF_INET if peer.version == 4 else socket.AF_INET6
    request = (_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
               + _SOCKID.pack(peer_port, local_port, peer.packed.ljust(16, b"\0"),
                              local.packed.ljust(16, b"\0"))
               + _SOCKID_TAIL.pack(0, 0xFFFFFFFF, 0xFFFFFFFF))
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.send(_NLMSG.pack(_NLMSG.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST,
                                1, 0) + request)
            reply = nl.recv(4096, socket.MSG_DONTWAIT)  # answered within send
    except AttributeError:  # not Linux
        raise OSError("no sock_diag here") from None
    if len(reply) < _NLMSG.size + _MSG_SIZE or _NLMSG.unpack_from(reply)[1] != _SOCK_DIAG_BY_FAMILY:
        return None  # an error: no such socket
    state = reply[_NLMSG.size + 1]
    sport, dport = _MSG_PORTS.unpack_from(reply, _NLMSG.size + 4)
    uid, inode = _MSG_OWNER.unpack_from(reply, _NLMSG.size + 64)
    if (sport, dport) != (peer_port, local_port):
        return None  # a listener found for want of the connection
    return state, uid, inode


_diag_found: bool | None = None  # what _diag_finds learnt; None: not yet


def _diag_finds() -> bool:
    """Whether sock_diag finds this machine's TCP connections (a kernel without its TCP
    part answers ENOENT, as for a socket that is not there): asked once, of a
    loopback connection of our own; False while that cannot be had."""
    global _diag_found
    if _diag_found is None:
        try:
            with socket.create_server(("127.0.0.1", 0)) as server, \
                    socket.create_connection(server.getsockname(), timeout=1) as conn:
                (here, here_port), (there, there_port) = conn.getsockname(), conn.getpeername()
                entry = _diag_entry(_address(here), here_port, _address(there), there_port)
        except OSError:
            return False  # no netlink, no loopback or no descriptor left: asked again next time
        _diag_found = entry is not None
    return _diag_found


def _hex(ip: _IP, port: int) -> str:
    packed = ip.packed
    words = "".join(f"{_WORD.unpack_from(packed, i)[0]:08X}" for i in range(0, len(packed), 4))
    return f"{words}:{port:04X}"


def _proc_owner(peer: _IP, peer_port: int, local: _IP, local_port: int) -> int | None:
    """The owner by its entry in ``/proc/net/tcp*`` (each file read once).

    An IPv4 pair is looked for in ``tcp`` as plain IPv4 (an IPv4 socket, even
    when the other end is a dual-stack IPv6 one), then in ``tcp6`` v4-mapped (a
    dual-stack IPv6 socket)."""
    if isinstance(peer, ipaddress.IPv4Address):
        mapped = [ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + a.packed) for a in (peer, local)]
        tables = [("/proc/net/tcp", _hex(peer, peer_port), _hex(local, local_port)),
                  ("/proc/net/tcp6", _hex(mapped[0], peer_port), _hex(mapped[1], local_port))]
    else:
        tables = [("/proc/net/tcp6", _hex(peer, peer_port), _hex(local, local_port))]
    for path, there, here in tables:
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError:
            return None
        key = f": {there} {here} ".encode()  # the sl column's colon, local and remote address
        at = text.find(key)
        if at >= 0:
            end = text.find(b"\n", at)
            fields = text[at + len(key):end if end >= 0 else len(text)].split()
            # st, tx:rx queue, tr:when, retransmits, uid, timeout, inode
            uid, inode = (ascii_int(f.decode("ascii", "replace")) for f in fields[4:7:2]) \
                if len(fields) > 6 else (None, None)
            if uid is not None and inode is not None:
                return _owner(uid, inode)
            return None
    return None
