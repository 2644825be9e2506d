"""Wire truth: the byte counters of the interface a rank's node sends inter-node traffic on.

Inside an emulated node's namespace, /sys/class/net/<iface>/statistics counts every frame
that crossed the shaped link (headers included), which is what the communicator's
algorithmic byte model is checked against.
"""

from __future__ import annotations

from pathlib import Path

from suite.results import schema


class WireCounters:
    def __init__(self, interface: str):
        self.stats = Path("/sys/class/net") / interface / "statistics"
        self._start = (0, 0)

    def read(self) -> tuple[int, int]:
        tx = int((self.stats / "tx_bytes").read_text())
        rx = int((self.stats / "rx_bytes").read_text())
        return tx, rx

    def start(self) -> None:
        self._start = self.read()

    def stop(self) -> dict[str, float]:
        tx, rx = self.read()
        return {
            schema.WIRE_TX_BYTES: float(tx - self._start[0]),
            schema.WIRE_RX_BYTES: float(rx - self._start[1]),
        }
