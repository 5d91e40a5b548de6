"""Runs inside the sandbox: relays 127.0.0.1 to the model endpoint's Unix socket, then runs a
command with ``ANTHROPIC_BASE_URL`` pointing at the relay.

Usage: ``python -I endpoint_relay.py SOCKET -- COMMAND [ARGS...]``. Standard library only: it is
run by path with the sandbox's view of the file system, not imported from the project. Exits with
the command's exit code (128 + N when it died of signal N; 127 when it cannot be executed).

Who is served: before it starts the command, the relay makes the first connection to the
endpoint, which from then on serves only the relay's process (``SO_PEERCRED``). The relay serves
only connections made by the command's own process — not by the processes it starts, such as the
code a CLI runs through its Bash tool: the connecting socket is looked up in ``/proc/net/tcp`` and
must be one of the command's open files. A refused connection gets a 403 and is reported to the
endpoint, which counts it (code ``relay_peer``). All processes of the run share one uid, so a
process allowed to ptrace the command could still speak as it; what it sends is metered and
capped by the endpoint all the same.
"""
import os
import socket
import struct
import subprocess
import sys
import threading

_FORBIDDEN = (b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nx-should-retry: false\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n%s")
_BODY = b'{"type":"error","error":{"type":"permission_error","message":"relay_peer: only the CLI itself may call the model"}}'


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _hex(addr: tuple) -> str:
    ip = struct.unpack("<I", socket.inet_aton(addr[0]))[0]
    return "%08X:%04X" % (ip, addr[1])


def _owned_by(client: socket.socket, pid: int) -> bool:
    """Whether the peer end of ``client`` (a loopback TCP connection) is an open file of ``pid``."""
    peer, local = _hex(client.getpeername()), _hex(client.getsockname())
    inode = None
    try:
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[1] == peer and fields[2] == local:
                    inode = fields[9]
                    break
        if inode is None:
            return False
        want = "socket:[%s]" % inode
        fds = "/proc/%d/fd" % pid
        for fd in os.listdir(fds):
            try:
                if os.readlink(os.path.join(fds, fd)) == want:
                    return True
            except OSError:
                continue
    except OSError:
        pass
    return False


def _ask(path: str, request: bytes) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(10)
        s.connect(path)
        s.sendall(request)
        while s.recv(4096):
            pass
        return True
    except OSError:
        return False
    finally:
        s.close()


def _refuse(client: socket.socket, path: str) -> None:
    try:
        client.sendall(_FORBIDDEN % (len(_BODY), _BODY))
        client.shutdown(socket.SHUT_WR)
        # read what the client still sends: closing with unread bytes would reset the connection
        # and lose the 403 before the client reads it
        client.settimeout(2)
        while client.recv(65536):
            pass
    except OSError:
        pass
    client.close()
    _ask(path, b"HEAD /.relay/refused HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")


def _serve(listener: socket.socket, path: str, child: list) -> None:
    while True:
        client, _ = listener.accept()
        if not child or not _owned_by(client, child[0]):
            threading.Thread(target=_refuse, args=(client, path), daemon=True).start()
            continue
        # bytes are relayed as they come: without this, Nagle and delayed ACKs stall small writes
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def main(argv: list) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: endpoint_relay.py SOCKET -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    path, command = argv[1], argv[3:]
    # the first connection claims the endpoint for this process, before any other process runs
    if not _ask(path, b"HEAD / HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n"):
        print("endpoint_relay: the model endpoint at %s does not answer; model calls will fail" % path,
              file=sys.stderr)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    child: list = []
    threading.Thread(target=_serve, args=(listener, path, child), daemon=True).start()
    env = dict(os.environ, ANTHROPIC_BASE_URL="http://127.0.0.1:%d" % port)
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        print("endpoint_relay: cannot execute %s: %s" % (command[0], exc.strerror or exc), file=sys.stderr)
        return 127
    child.append(proc.pid)
    code = proc.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    status = main(sys.argv)
    sys.stderr.flush()
    os._exit(status)  # relay threads may sit in accept/recv: do not wait for them
