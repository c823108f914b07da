"""A tiny TCP node for the network-fault tests: an echo server, and a client driven over stdin.

Run ``python netnode.py ADDRESS``. It listens on ADDRESS and a free port the kernel picks, prints
``listening PORT`` and then answers each command line on stdin with one line on stdout:

    probe HOST PORT TIMEOUT_S      connect, send "ping", await its echo: "ok" | "fail REASON"
    open NAME HOST PORT TIMEOUT_S  open a connection and keep it as NAME: "ok" | "fail REASON"
    send NAME TEXT                 send a line on NAME: "ok" | "fail REASON"
    recv NAME TIMEOUT_S            the next line NAME receives: "line TEXT" | "timeout" | "fail ..."
    push TEXT                      send a line to every accepted connection: "ok N"
    received                       lines the server has received in all: "count N"

The server echoes every line it receives. Standard library only; it exits when stdin closes.
"""

from __future__ import annotations

import socket
import sys
import threading

MAX_LINE_BYTES = 4096
MAX_ACCEPTED = 64


class Server:
    """Echo server that counts the lines it receives and can push to its peers."""

    def __init__(self, address: str) -> None:
        self.listener = socket.create_server((address, 0), backlog=MAX_ACCEPTED)
        self.port: int = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.accepted: list[socket.socket] = []
        self.received = 0

    def serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            with self.lock:
                if len(self.accepted) >= MAX_ACCEPTED:
                    conn.close()
                    continue
                self.accepted.append(conn)
            threading.Thread(target=self.echo, args=(conn,), daemon=True).start()

    def echo(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rb") as lines:
                for line in lines:
                    with self.lock:
                        self.received += 1
                    conn.sendall(line[:MAX_LINE_BYTES])
        finally:
            with self.lock:
                self.accepted.remove(conn)

    def push(self, text: str) -> int:
        with self.lock:
            peers = list(self.accepted)
        for conn in peers:
            conn.sendall(text.encode() + b"\n")
        return len(peers)


class Client:
    """Named outgoing connections, each read line by line with a timeout."""

    def __init__(self) -> None:
        self.conns: dict[str, tuple[socket.socket, bytearray]] = {}

    def open(self, name: str, host: str, port: int, timeout_s: float) -> None:
        self.conns[name] = (socket.create_connection((host, port), timeout=timeout_s), bytearray())

    def send(self, name: str, text: str) -> None:
        self.conns[name][0].sendall(text.encode() + b"\n")

    def recv(self, name: str, timeout_s: float) -> str:
        conn, buffer = self.conns[name]
        conn.settimeout(timeout_s)
        while b"\n" not in buffer:
            chunk = conn.recv(MAX_LINE_BYTES)
            if not chunk:
                raise ConnectionError("closed by peer")
            buffer += chunk
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        return line.decode()


def probe(host: str, port: int, timeout_s: float) -> None:
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.sendall(b"ping\n")
        if conn.makefile("rb").readline() != b"ping\n":
            raise ConnectionError("no echo")


def answer(server: Server, client: Client, words: list[str]) -> str:
    command, args = words[0], words[1:]
    try:
        if command == "probe":
            probe(args[0], int(args[1]), float(args[2]))
        elif command == "open":
            client.open(args[0], args[1], int(args[2]), float(args[3]))
        elif command == "send":
            client.send(args[0], args[1])
        elif command == "recv":
            return f"line {client.recv(args[0], float(args[1]))}"
        elif command == "push":
            return f"ok {server.push(args[0])}"
        elif command == "received":
            with server.lock:
                return f"count {server.received}"
        else:
            return f"fail unknown command {command}"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return f"fail {type(exc).__name__}: {exc}"
    return "ok"


def main() -> None:
    server = Server(sys.argv[1])
    threading.Thread(target=server.serve, daemon=True).start()
    client = Client()
    print(f"listening {server.port}", flush=True)
    for line in sys.stdin:
        if line.strip():
            print(answer(server, client, line.split()), flush=True)


if __name__ == "__main__":
    main()
