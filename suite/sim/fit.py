"""The fitting half of ``bench calibrate``: from the ranks' raw timings to a profile's
numbers (ring all-reduce links by least squares on relative error, step seconds and the
wait for the slowest rank per synchronization), each with how it was obtained."""

from __future__ import annotations

import time

import numpy as np

from suite.errors import BenchError
from suite.sim.costmodel import Link, ring_allreduce
from suite.sim.measure import shaped_burst
from suite.sim.profile import link_from


def fit_ring(times: list[list[float]], n: int, burst: float = 0.0) -> tuple[Link, float]:
    """alpha and bandwidth of the ring all-reduce formula ``T = 2(n-1) alpha + max(0, L -
    burst) / B`` (L = 2(n-1)/n S, the bytes each rank sends), fitted to (size, seconds) pairs
    by least squares on relative error; ``burst``: a shaped link's bucket, known from its
    qdisc. Returns the link and the worst relative residual.

    Where two or more sizes lie beyond the burst, B is fitted on those alone and alpha then
    on every size (Hockney's split: large messages measure bandwidth, small ones latency), so
    a latency point slowed by a late peer cannot tilt the line into a rate above the link's.
    On an unshaped link every size is beyond the burst, and the split is the joint fit."""
    sizes = np.array([s for s, t in times if np.isfinite(t)], dtype=float)
    secs = np.array([t for s, t in times if np.isfinite(t)], dtype=float)
    paced = np.maximum(2 * (n - 1) / n * sizes - burst, 0.0)
    if len(np.unique(paced)) < 2:
        raise BenchError(
            f"need at least two buffer sizes, one beyond the link's {burst:.0f}-byte burst, "
            "to fit a link (--sizes)"
        )
    beyond = paced > 0
    if len(np.unique(paced[beyond])) < 2:  # one size beyond the burst: no slope of its own
        beyond = np.ones_like(beyond)
    slope = np.polyfit(paced[beyond], secs[beyond], 1, w=1 / secs[beyond])[0]
    weights = 1 / secs**2  # relative error: minimise sum(((c + slope p - t) / t)^2) over c
    intercept = np.sum(weights * (secs - slope * paced)) / np.sum(weights)
    if slope <= 0:
        raise BenchError(
            f"all-reduce times over {n} ranks do not grow with size ({times}); measure larger "
            "buffers (--sizes) or more repeats (--repeats)"
        )
    alpha = max(float(intercept), 0.0) / (2 * (n - 1))
    link = Link(alpha, 1 / float(slope), burst)
    predicted = np.array([ring_allreduce(s, n, link) for s in sizes])
    return link, float(np.max(np.abs(predicted - secs) / secs))


def block_statistics(block_steps: list[int], repeats: int, seconds: list[list[float]]):
    """Seconds per step (mean over ranks and blocks, per step taken), the measured wait for
    the slowest rank, [[k, mean over blocks of (max - mean over ranks)], ...], and the mean
    seconds per step of each block size, [[k, seconds], ...]."""
    table = np.asarray(seconds, dtype=float).reshape(len(block_steps), repeats, -1)
    per_step = table.mean(axis=2).sum() / (repeats * sum(block_steps))
    waits = (table.max(axis=2) - table.mean(axis=2)).mean(axis=1)
    by_size = table.mean(axis=(1, 2)) / np.asarray(block_steps)
    return (
        float(per_step),
        [[k, float(w)] for k, w in zip(block_steps, waits)],
        [[k, float(t)] for k, t in zip(block_steps, by_size)],
    )


def _measured_link(link_name: str, entry: dict, plan: dict, where: str) -> dict:
    """One link's profile entry fitted from its all-reduce timings; split out of
    ``build_profile`` so the provenance text of a shaped link sits beside its fit.

    Args:
        link_name: ``"intra"`` or ``"inter"``; only the inter-node link is shaped.
        entry: the ranks' raw timings of that link (``n`` ranks, ``times``).
        plan: the calibration plan (its network names the shapers' qdisc).
        where: the command, host and date every source line ends with.
    """
    burst = shaped_burst(plan) if link_name == "inter" else 0
    link, worst = fit_ring(entry["times"], entry["n"], burst)
    fitted = {
        "alpha_s": link.alpha,
        "bandwidth_Bps": link.bandwidth,
        "source": f"measured: fit of all-reduce times over {entry['n']} ranks, worst "
        f"relative residual {worst:.1%}; {where}",
        "measurements": entry["times"],
    }
    if burst:
        fitted["burst_bytes"] = burst
        fitted["source"] += (
            f"; burst_bytes: the shapers' token bucket ({plan['network']['qdisc']}), "
            "each collective timed after it refilled"
        )
    return fitted


def _profile_links(raw: dict, plan: dict, where: str, links_from: dict | None) -> dict:
    """The intra- and inter-node links, fitted where this layout measured them and taken
    from ``links_from`` where it could not (one node, or one rank per node); raises
    ``BenchError`` when a link is unmeasured and no profile was given to borrow from."""
    links = {}
    for link_name in ("intra", "inter"):
        entry = raw["links"][link_name]
        if entry["n"] < 2:
            if links_from is None:
                raise BenchError(
                    f"cannot measure {link_name}-node links with {plan['gpus']} ranks at "
                    f"{plan['gpus_per_node']} per node (need 2+ nodes of 2+ ranks); give "
                    "--links-from PROFILE to take them from a published profile"
                )
            links[link_name] = dict(links_from["links"][link_name])
            links[link_name]["source"] = (
                f"from profile {links_from['name']!r}: " + links[link_name]["source"]
            )
            continue
        links[link_name] = _measured_link(link_name, entry, plan, where)
    return links


def _profile_steps(raw: dict, plan: dict, where: str) -> tuple[dict, list, list]:
    """Each workload's step entry, with the backward share of every workload and the
    overlap measured where an all-reduce was timed (``comm`` is NaN where it was not);
    the two lists feed the profile's compute means, in workload order."""
    steps = {}
    backward, overlap = [], []
    for workload, (fwd, bwd, opt, comm, together, jitter) in raw["compute"].items():
        total = fwd + bwd + opt
        backward.append(bwd / total)
        if comm == comm:  # measured: the share of min(comm, backward) that was hidden
            hidden = (total + comm - together) / min(comm, bwd)
            overlap.append(min(1.0, max(0.0, hidden)))
        per_step, waits, by_size = block_statistics(
            plan["block_steps"], plan["block_repeats"], raw["blocks"][workload]
        )
        steps[f"{workload}@{plan['batch_size']}"] = {
            "seconds": per_step,
            "forward_s": fwd,
            "backward_s": bwd,
            "optimizer_s": opt,
            "jitter_s": jitter,
            "sync_wait_s": waits,
            "sync_wait_ranks": plan["gpus"],
            "block_step_s": by_size,
            "source": f"measured: mean over {plan['gpus']} ranks and {plan['block_repeats']} "
            f"round-started blocks of each of {plan['block_steps']} steps; forward/backward/"
            f"optimizer split from {plan['steps']} free-running steps (slowest rank); "
            f"sync_wait_s: mean (slowest - mean rank) per block size; inputs: "
            f"{raw.get('data', {}).get(workload, 'random stand-in inputs')}; {where}",
        }
    return steps, backward, overlap


def build_profile(
    raw: dict,
    plan: dict,
    *,
    name: str,
    description: str,
    command: str,
    links_from: dict | None = None,
) -> dict:
    """The profile JSON from the ranks' raw measurements; links that cannot be measured with
    this layout (one node, or one rank per node) are taken from ``links_from``."""
    stamp = time.strftime("%Y-%m-%d")
    device = raw.get("device_name") or plan["device"]
    where = f"`{command}` on {raw['hostname']} ({device}, torch {raw.get('torch', '?')}), {stamp}"
    links = _profile_links(raw, plan, where, links_from)
    steps, backward, overlap = _profile_steps(raw, plan, where)
    return {
        "name": name,
        "description": description,
        "gpus_per_node": (links_from or {}).get("gpus_per_node", plan["gpus_per_node"])
        if plan["gpus"] == 1
        else plan["gpus_per_node"],
        "links": links,
        "memory_bandwidth": {
            "bandwidth_Bps": raw["memory_bandwidth"],
            "source": f"measured: 256 MiB device copy, read + write; {where}",
        },
        "compute": {
            "backward_fraction": float(np.mean(backward)),
            "backward_fraction_source": "measured: backward / step time, mean over workloads",
            "overlap_efficiency": float(np.mean(overlap)) if overlap else 1.0,
            "overlap_efficiency_source": (
                "measured: (step + all-reduce - both at once) / min(all-reduce, backward), "
                "all-reduce of the gradient size over the world during backward"
                if overlap
                else "not measurable with one rank; assumed 1 (full overlap)"
            ),
            "steps": steps,
        },
        "world_check": raw["links"]["world"],
        "network": plan.get("network", {"mode": "loopback"}),
    }


def world_check(profile: dict, gpus: int) -> list[tuple[int, float, float]]:
    """(size, measured, predicted) for the flat world all-reduce, priced like the simulator
    prices DDP's: a ring paced by the inter-node link."""
    inter = link_from(profile["links"]["inter"])
    return [
        (int(size), seconds, ring_allreduce(size, gpus, inter))
        for size, seconds in profile["world_check"]["times"]
        if seconds == seconds  # NaN: not measurable with this layout
    ]
