"""Emulated nodes with rate-limited links between them, on one Linux machine (root, iproute2).

Each emulated node is a network namespace ``pxb-<tag>-n<i>`` whose ranks share its loopback
(intra-node traffic never leaves it) and one veth interface ``vnic`` (10.77.0.<i+1>/24). The
other ends of the veth pairs are ports of a bridge that lives in its own namespace
``pxb-<tag>-br``, so nothing is created in the root namespace. Every inter-node byte crosses
two token-bucket shapers (tc tbf): the node's uplink (``vnic``) and its downlink (the bridge
port). The links run jumbo frames (MTU 9000, as HPC fabrics do), so TCP/IP framing adds
under 1% to the wire bytes. netem is not in every kernel: links have bandwidth, no added delay.

Set-up and tear-down are paired in a context manager that also runs on SIGTERM/SIGINT. A
SIGKILLed parent cannot clean up; ``bench net-cleanup`` deletes what such a run left.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from suite.errors import BenchError
from suite.processes import alive, descendants, kill_all, pid_alive

PREFIX = "pxb-"
INTERFACE = "vnic"
SUBNET = "10.77.0"
MTU = 9000
# One counted packet = one frame (no segmentation offload: veth would otherwise count one
# header per 64 KiB super-packet), and no IPv6 link-local chatter in the counters.
FRAMES = ("gso_max_segs", "1", "addrgenmode", "none")
# Names this module gives: pxb-<creating pid>x<4 hex>-br | -n<i>; others are never touched.
OURS = re.compile(rf"^{re.escape(PREFIX)}(\d+)x[0-9a-f]{{4}}-(br|n\d+)$")
MASTER_PORT = 29500
# The shapers' bucket: tbf needs one at least as large as a timer tick's worth of bytes at the
# rate; it lets this much through at line speed after the link idles (the simulator models it).
BURST_BYTES = 256 * 1024
# How long a packet may wait in a shaper's queue before tbf drops it.
LATENCY = "50ms"
UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def parse_rate(text: str) -> int:
    """``1gbit``, ``200mbit``, ``1.5gbit`` (tc's units) -> bits per second."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]?bit)\s*", str(text).lower())
    if not match or float(match.group(1)) <= 0:
        raise BenchError(f"--inter-bw {text!r} is not a rate; use e.g. 200mbit or 1gbit")
    return int(float(match.group(1)) * UNITS[match.group(2)])


def shaper(rate: int) -> list[str]:
    """tc's arguments for a link shaped to ``rate`` bits/s (after ``qdisc replace dev X
    root``): the one declaration of the links' shaping, which ``tools/cluster-up`` reads too
    (``python -m suite.cluster.netemu --shaper RATE``)."""
    return ["tbf", "rate", f"{rate}bit", "burst", f"{BURST_BYTES // 1024}kb", "latency", LATENCY]


def check_privileges() -> None:
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        why = f"{', '.join(missing)} not found" if missing else "not running as root"
        raise BenchError(
            f"--network emulated needs root and iproute2 (ip, tc): {why}; "
            "install iproute2 and run as root, or use --network loopback"
        )


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode:
        raise BenchError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def _tc(namespace: str, *args: str) -> None:
    proc = subprocess.run(["tc", "-n", namespace, *args], capture_output=True, text=True)
    if proc.returncode:
        raise BenchError(f"tc -n {namespace} {' '.join(args)}: {proc.stderr.strip()}")


def leftover_namespaces(*, dead_owner_only: bool = False) -> list[str]:
    """Namespaces of emulated clusters; with ``dead_owner_only``, those whose creating
    process no longer runs (left by a parent killed with SIGKILL)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if OURS.match(line.split()[0] or "")]
    return [n for n in names if not (dead_owner_only and pid_alive(int(OURS.match(n).group(1))))]


def delete_namespaces(names: list[str]) -> None:
    for name in names:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


class EmulatedCluster:
    """``num_nodes`` namespaces on a bridge, inter-node links shaped to ``rate`` bits/s."""

    def __init__(self, num_nodes: int, rate: int, tag: str):
        self.num_nodes = num_nodes
        self.rate = rate
        digest = hashlib.sha1(f"{tag}-{time.time_ns()}".encode()).hexdigest()[:4]
        self.tag = f"{os.getpid()}x{digest}"  # the pid tells net-cleanup if the run is alive
        self.bridge = f"{PREFIX}{self.tag}-br"
        self.nodes = [f"{PREFIX}{self.tag}-n{i}" for i in range(num_nodes)]
        self.created: list[str] = []

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    @property
    def qdisc(self) -> list[str]:
        return shaper(self.rate)

    def describe(self) -> dict:
        return {
            "mode": "emulated",
            "inter_bw_bits_per_s": self.rate,
            "namespaces": self.nodes,
            "interface": INTERFACE,
            "mtu": MTU,
            "qdisc": " ".join(self.qdisc) + " (uplink and downlink)",
            "burst_bytes": BURST_BYTES,
        }

    def setup(self) -> EmulatedCluster:
        check_privileges()
        try:
            self._add_namespace(self.bridge)
            _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            _ip(
                "-n",
                self.bridge,
                "link",
                "set",
                "br0",
                "mtu",
                str(MTU),
                "addrgenmode",
                "none",
                "up",
            )
            for i, ns in enumerate(self.nodes):
                self._add_namespace(ns)
                port = f"p{i}"
                _ip("link", "add", INTERFACE, "netns", ns, "mtu", str(MTU), "type", "veth",
                    "peer", "name", port, "netns", self.bridge, "mtu", str(MTU))
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", INTERFACE)
                _ip("-n", ns, "link", "set", INTERFACE, *FRAMES, "up")
                _ip("-n", self.bridge, "link", "set", port, "master", "br0", *FRAMES, "up")
                _tc(ns, "qdisc", "replace", "dev", INTERFACE, "root", *self.qdisc)
                _tc(self.bridge, "qdisc", "replace", "dev", port, "root", *self.qdisc)
        except BaseException:
            self.teardown()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self.created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def teardown(self) -> None:
        delete_namespaces(self.created)  # deleting a namespace removes its veth ends
        self.created = []

    def command(self, node: int, argv: list[str], env: dict[str, str]) -> list[str]:
        """``argv`` run inside node ``node``'s namespace with ``env`` added."""
        pairs = [f"{k}={v}" for k, v in env.items()]
        return ["ip", "netns", "exec", self.nodes[node], "env", *pairs, *argv]


@contextmanager
def emulated_cluster(num_nodes: int, rate: int, tag: str):
    """Set up, yield, and tear down on exit, exception, SIGINT or SIGTERM."""

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    cluster = EmulatedCluster(num_nodes, rate, tag)
    try:
        yield cluster.setup()
    finally:
        cluster.teardown()
        signal.signal(signal.SIGTERM, previous)


def run_module_in_cluster(
    cluster: EmulatedCluster,
    gpus_per_node: int,
    module: str,
    args: list[str],
    logs: Path,
    shutdown_seconds: int = 30,
) -> int:
    """Run ``python -m module args`` as ``gpus_per_node`` ranks on every emulated node (one
    torchrun agent per namespace, static rendezvous on node 0); returns the worst exit code.
    Any node failing stops the others; stopped ranks get ``shutdown_seconds`` to checkpoint.
    Launcher output goes to ``logs/node<i>.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    env = _agent_env()
    procs, files, ranks = [], [], set()
    try:
        for node in range(cluster.num_nodes):
            argv = _agent_argv(cluster, node, gpus_per_node, module, args, shutdown_seconds)
            log = open(logs / f"node{node}.log", "w")
            files.append(log)
            procs.append(
                subprocess.Popen(
                    cluster.command(node, argv, env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        codes = [None] * len(procs)
        last_look = 0.0
        while any(c is None for c in codes):
            if time.monotonic() - last_look > 1.0:  # the ranks, to stop them with the agents
                ranks = {r for r in ranks if alive(r)}
                ranks.update(r for proc in procs for r in descendants(proc.pid))
                last_look = time.monotonic()
            for i, proc in enumerate(procs):
                if codes[i] is None:
                    try:
                        codes[i] = proc.wait(timeout=0.2)
                    except subprocess.TimeoutExpired:
                        continue
                    if codes[i]:
                        _stop(procs, ranks, shutdown_seconds)
        return max(abs(c) for c in codes)
    finally:
        _stop(procs, ranks, shutdown_seconds)
        for log in files:
            log.close()


def _agent_env() -> dict[str, str]:
    """What every node's agent and ranks get added to their environment: gloo bound to the
    emulated link, one thread per rank, torch's C++ log quiet unless asked, and this
    process's import path (so the module resolves inside the namespaces as it does here)."""
    return {
        "GLOO_SOCKET_IFNAME": INTERFACE,  # else gloo resolves the hostname to 127.0.0.1
        "OMP_NUM_THREADS": "1",
        # no hostname warnings
        "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }


def _agent_argv(
    cluster: EmulatedCluster,
    node: int,
    gpus_per_node: int,
    module: str,
    args: list[str],
    shutdown_seconds: int,
) -> list[str]:
    """The torchrun agent command of one emulated node: a static rendezvous on node 0's
    address, so every node's agent finds the others without a shared store.

    Args:
        node: the node's index, its torchrun node rank.
        shutdown_seconds: how long a stopped rank has to checkpoint before SIGKILL.
    """
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(cluster.num_nodes), "--node-rank", str(node),
        "--nproc-per-node", str(gpus_per_node),
        "--master-addr", cluster.address(0), "--master-port", str(MASTER_PORT),
        "--shutdown-timeout", str(shutdown_seconds),
        "-m", module, *args,
    ]


def _stop(procs: list[subprocess.Popen], ranks: set[int], grace: float) -> None:
    """SIGTERM to every agent (which passes it to its ranks); after ``grace`` seconds, SIGKILL
    to the agents and to every rank still alive: no rank outlives the launcher."""
    for proc in procs:
        ranks.update(descendants(proc.pid))
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    while any(alive(rank) for rank in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_all(ranks)


def main(argv: list[str] | None = None) -> int:
    """``python -m suite.cluster.netemu --shaper 200mbit | --frames | --mtu``: the links'
    settings as words for a shell (tools/cluster-up builds its hosts' links from them);
    exit 2 with one line on stderr for a rate that is not one."""
    parser = argparse.ArgumentParser(prog="python -m suite.cluster.netemu")
    said = parser.add_mutually_exclusive_group(required=True)
    said.add_argument("--shaper", metavar="RATE", help="tc's tbf arguments for a link of RATE")
    said.add_argument("--frames", action="store_true", help="ip link's settings of a link")
    said.add_argument("--mtu", action="store_true", help="the links' MTU")
    args = parser.parse_args(argv)
    try:
        words = (shaper(parse_rate(args.shaper)) if args.shaper is not None
                 else list(FRAMES) if args.frames else [str(MTU)])
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(" ".join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
