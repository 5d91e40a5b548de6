"""Runs inside the sandbox: relays 127.0.0.1 to the model endpoint's Unix socket, then runs a
command with ``ANTHROPIC_BASE_URL`` pointing at the relay.

Usage: ``python -I endpoint_relay.py SOCKET -- COMMAND [ARGS...]``. Standard library only: it is
run by path with the sandbox's view of the file system, not imported from the project. Exits with
the command's exit code (128 + N when it died of signal N; 127 when it cannot be executed).
"""
import os
import socket
import subprocess
import sys
import threading


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


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
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
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    env = dict(os.environ, ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}")
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        print(f"endpoint_relay: cannot execute {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    status = main(sys.argv)
    sys.stderr.flush()
    os._exit(status)  # relay threads may sit in accept/recv: do not wait for them
