"""A delay line in user space, for kernels without ``tc netem`` (``bench.netem``'s other wire).

``python -m bench.delay_line --delay-ms D --ready PATH NAME=ADDRESS...``

Opens one TUN device (layer 3, no packet information) per ``NAME``, writes ``PATH`` once they
exist, and then, until killed, forwards every IPv4 packet read from any device to the device of
its destination address ``D`` ms later (packets to unknown addresses are dropped). The harness
moves each device into a node's namespace and gives it ``ADDRESS``/24, so the devices and this
process are the network between the namespaces: a switch whose every hop takes D.

A netem qdisc delays in the kernel; this delays in a Python process, so its figures carry the
process's own wake-up jitter (tens of µs on an idle machine, more on a busy one) and it costs CPU
per packet; the devices' MTU is large (``MTU``) so a bulk transfer is few packets. One delay for
every packet keeps them in order: a FIFO is the whole schedule (:class:`DelayQueue`).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import select
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MTU = 65_000  # a bulk transfer in few packets (the devices' MTU, set by the harness)
READ_BYTES = 65_536
READS_PER_WAKE = 64  # packets read from one device before the others get a turn


class DelayQueue:
    """Packets held ``delay_s``, in arrival order (one delay for all: FIFO is due order)."""

    def __init__(self, delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.delay_s = delay_s
        self.clock = clock
        self._held: deque[tuple[float, int, bytes]] = deque()

    def __len__(self) -> int:
        return len(self._held)

    def add(self, out: int, packet: bytes) -> None:
        self._held.append((self.clock() + self.delay_s, out, packet))

    def due(self) -> list[tuple[int, bytes]]:
        """The packets whose time has come, removed, in order."""
        now = self.clock()
        found = []
        while self._held and self._held[0][0] <= now:
            _, out, packet = self._held.popleft()
            found.append((out, packet))
        return found

    def wait_s(self) -> float | None:
        """Until the next packet is due (None: nothing held)."""
        if not self._held:
            return None
        return max(0.0, self._held[0][0] - self.clock())


def destination(packet: bytes) -> bytes | None:
    """The IPv4 destination address of ``packet`` (4 bytes); None for anything else."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    return packet[16:20]


def parse_device(spec: str) -> tuple[str, bytes]:
    name, _, address = spec.partition("=")
    if not name or not address:
        raise ValueError(f"a device is NAME=ADDRESS, not {spec!r}")
    return name, socket.inet_aton(address)


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def forward(devices: dict[bytes, int], delay_s: float) -> None:
    """Forever: read from every device, hold, write to the destination's device."""
    queue = DelayQueue(delay_s)
    fds = list(devices.values())
    while True:
        readable, _, _ = select.select(fds, [], [], queue.wait_s())
        for fd in readable:
            for _ in range(READS_PER_WAKE):
                try:
                    packet = os.read(fd, READ_BYTES)
                except BlockingIOError:
                    break
                out = devices.get(destination(packet) or b"")
                if out is not None:
                    queue.add(out, packet)
        for out, packet in queue.due():
            try:
                os.write(out, packet)
            except OSError:  # a device not up yet, or its queue full: the packet is lost
                continue


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("devices", nargs="+", help="NAME=ADDRESS")
    args = parser.parse_args(argv)
    devices = {address: open_tun(name) for name, address in map(parse_device, args.devices)}
    args.ready.touch()
    forward(devices, args.delay_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
