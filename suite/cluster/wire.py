"""Wire truth: the byte counters of the interface a rank's node sends inter-node traffic on.

Inside an emulated node's namespace, /sys/class/net/<iface>/statistics counts every frame
that crossed the shaped link (headers included), which is what the communicator's
algorithmic byte model is checked against. On real hosts (a multi-host job) the interface is
the one holding the address this host's name resolves to, the one gloo connects from; its
counters then hold whatever else the host sent too (a dedicated fabric, as tools/cluster-up
gives, carries only the run).
"""

from __future__ import annotations

import fcntl
import socket
import struct
from pathlib import Path

from suite.results import schema

#: this process's network namespace's interface counters (/sys/class/net shows the namespace
#: /sys was mounted in, which nsenter --net does not change)
NET_DEV = Path("/proc/self/net/dev")


class WireCounters:
    """An interface's transmitted and received bytes, read at an iteration's start and end."""

    def __init__(self, interface: str):
        self.interface = interface
        self._start = (0, 0, 0)

    def read(self) -> tuple[int, int, int]:
        """(tx bytes, rx bytes, tx frames) of the interface, as the kernel counts them
        (frames, headers included)."""
        for line in NET_DEV.read_text().splitlines()[2:]:
            name, _, fields = line.partition(":")
            if name.strip() == self.interface:
                numbers = fields.split()
                return int(numbers[8]), int(numbers[0]), int(numbers[9])
        raise FileNotFoundError(f"no interface {self.interface} in {NET_DEV}")

    def start(self) -> None:
        self._start = self.read()

    def stop(self) -> dict[str, float]:
        tx, rx, frames = self.read()
        return {
            schema.WIRE_TX_BYTES: float(tx - self._start[0]),
            schema.WIRE_RX_BYTES: float(rx - self._start[1]),
            schema.WIRE_TX_FRAMES: float(frames - self._start[2]),
        }


#: ioctl SIOCGIFADDR: an interface's IPv4 address (linux/sockios.h)
SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str | None:
    """``name``'s IPv4 address, None if it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def host_interface(hostname: str | None = None) -> str | None:
    """The interface that holds the address ``hostname`` (this host's, by default) resolves
    to: where gloo connects from and other hosts' bytes arrive. None when the name resolves to
    loopback or to no local interface (a single-host run, or a name the host does not own)."""
    try:
        address = socket.gethostbyname(hostname or socket.gethostname())
    except OSError:
        return None
    if address.startswith("127."):
        return None
    for _, name in socket.if_nameindex():
        if name != "lo" and interface_address(name) == address:
            return name
    return None
