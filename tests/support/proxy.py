"""A TCP proxy that fails the network on purpose: between the services and the broker, it
resets every open connection at random moments and refuses new ones for a while after each
reset, as a rescheduled broker pod, a moving leader or a network blip do. Services stay alive;
only their connections fail.

The broker advertises the proxy's port, so every connection a client makes, bootstrap and
per-broker alike, goes through it.
"""

from __future__ import annotations

import random
import selectors
import socket
import struct
import threading
import time
from pathlib import Path


def port_outside_ephemeral_range() -> int:
    """A free port no outgoing connection can be given: the proxy closes its listening socket
    to refuse connections and must get the port back (a port from the ephemeral range can be
    taken by any client's connection meanwhile; it happened in the 11th of 20 runs)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) \
        if Path("/proc/sys/net/ipv4/ip_local_port_range").exists() else 32768
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(10_000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port below {low}")


class FaultyProxy:
    def __init__(self, listen_port: int, target_port: int, host: str = "127.0.0.1"):
        self.host, self.listen_port, self.target_port = host, listen_port, target_port
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.resets = self.refusals = 0
        self.refusing = threading.Event()
        self.stopped = threading.Event()
        self.listener = self._listen()
        self.threads = [threading.Thread(target=self._accept, daemon=True, name="proxy-accept"),
                        threading.Thread(target=self._pump, daemon=True, name="proxy-pump")]
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        for t in self.threads:
            t.start()

    def _listen(self) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.listen_port))
        s.listen(128)
        s.settimeout(0.1)
        return s

    def _accept(self) -> None:
        while not self.stopped.is_set():
            if self.refusing.is_set():  # not listening: a connect is refused
                self.stopped.wait(0.05)
                continue
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection((self.host, self.target_port), timeout=2)
            except OSError:
                abort(client)
                continue
            for s in (client, upstream):
                s.setblocking(False)
            with self.lock:
                self.pairs.append((client, upstream))
                self.selector.register(client, selectors.EVENT_READ, upstream)
                self.selector.register(upstream, selectors.EVENT_READ, client)
            self.wake_w.send(b"x")

    def _pump(self) -> None:
        while not self.stopped.is_set():
            for key, _ in self.selector.select(0.2):
                if key.fileobj is self.wake_r:
                    self.wake_r.recv(4096)
                    continue
                src, dst = key.fileobj, key.data
                try:
                    data = src.recv(1 << 16)
                    if data:
                        dst.setblocking(True)
                        dst.sendall(data)
                        dst.setblocking(False)
                        continue
                except OSError:
                    pass
                self._drop(src)

    def _drop(self, sock) -> None:
        with self.lock:
            pair = next((p for p in self.pairs if sock in p), None)
            if pair is None:
                return
            self.pairs.remove(pair)
            for s in pair:
                try:
                    self.selector.unregister(s)
                except (KeyError, ValueError):
                    pass
                abort(s)

    def reset_all(self) -> int:
        """Reset every open connection (RST to both ends); the number reset."""
        with self.lock:
            pairs = list(self.pairs)
        for client, _ in pairs:
            self._drop(client)
        self.resets += 1
        return len(pairs)

    def refuse(self, seconds: float) -> None:
        """Refuse new connections for ``seconds`` (the listening socket is closed, then opened again)."""
        self.refusals += 1
        self.refusing.set()
        self.listener.close()
        self.stopped.wait(seconds)
        self.listener = self._listen()
        self.refusing.clear()

    def faults(self, duration_s: float, reset_every_s=(2.0, 7.0), refuse_s=(1.0, 3.0), seed: int = 0) -> None:
        """For ``duration_s``: wait a random 2-7 s, reset every connection, refuse new ones for
        a random 1-3 s; again. Returns once the network is healed."""
        rng = random.Random(seed)
        end = time.monotonic() + duration_s
        while (left := end - time.monotonic()) > 0:
            if self.stopped.wait(min(left, rng.uniform(*reset_every_s))) or time.monotonic() >= end:
                break
            self.reset_all()
            self.refuse(min(rng.uniform(*refuse_s), max(0.0, end - time.monotonic())))

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(5)
        self.reset_all()
        self.listener.close()


def abort(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a clean FIN: what a peer that vanished leaves."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass
