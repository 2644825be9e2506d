"""The simulator: cost models against step-by-step executions of the algorithms they price,
the link each group is priced on, DDP's overlap rule, and simulated bytes equal to the bytes
real 2 x 2 runs of the same methods record."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from suite.sim.costmodel import (
    Link,
    chain_broadcast,
    hierarchical_allreduce,
    ring_allgather,
    ring_allreduce,
)
from suite.sim.pricing import SimCommunicator
from suite.sim.profile import Profile
from suite.sim.standins import sim_topology

BENCH = [sys.executable, "-m", "suite.cli"]
SLOW_LINK = Link(alpha=1e-4, bandwidth=1e8)


def bench(*args):
    env = {**os.environ, "PRUNEX_PROGRESS": "0"}
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=300, env=env)


def stepwise_ring_allreduce(values: torch.Tensor, link: Link) -> tuple[torch.Tensor, float]:
    """Run a ring all-reduce chunk by chunk on real data (reduce-scatter, then all-gather),
    every rank sending one chunk to its successor per step; returns the result and the time
    (a step costs alpha plus the chunk over the link: all ranks send at once)."""
    n = values.shape[0]
    chunks = list(values.clone().chunk(n, dim=1))  # chunks[c][rank]
    elapsed = 0.0
    for step in range(n - 1):  # reduce-scatter
        sent = [(r, (r - step) % n) for r in range(n)]
        payload = {(r, c): chunks[c][r].clone() for r, c in sent}
        for r, c in sent:
            chunks[c][(r + 1) % n] += payload[(r, c)]
        elapsed += link.alpha + chunks[0][0].numel() * 4 / link.bandwidth
    for step in range(n - 1):  # all-gather of the reduced chunks
        sent = [(r, (r + 1 - step) % n) for r in range(n)]
        payload = {(r, c): chunks[c][r].clone() for r, c in sent}
        for r, c in sent:
            chunks[c][(r + 1) % n] = payload[(r, c)]
        elapsed += link.alpha + chunks[0][0].numel() * 4 / link.bandwidth
    return torch.cat(chunks, dim=1), elapsed


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_allreduce_matches_a_stepwise_ring(n):
    values = torch.randn(n, 64 * n)  # row r: rank r's buffer of 64n fp32 values
    reduced, elapsed = stepwise_ring_allreduce(values, SLOW_LINK)
    assert torch.allclose(reduced, values.sum(0).expand(n, -1), atol=1e-5)
    assert ring_allreduce(values[0].numel() * 4, n, SLOW_LINK) == pytest.approx(elapsed)


def test_allgather_broadcast_and_hierarchy_closed_forms():
    piece, n = 1000.0, 5
    assert ring_allgather(piece, n, SLOW_LINK) == pytest.approx(4 * (1e-4 + piece / 1e8))
    # pipelined chain: k chunks through n-1 hops take (n - 2 + k) chunk-steps; alpha = 0 and
    # many chunks approach the closed form's bandwidth term S/B
    size, k = 1e6, 10_000
    chunked = (n - 2 + k) * (size / k) / SLOW_LINK.bandwidth
    assert chain_broadcast(size, n, Link(0.0, 1e8)) == pytest.approx(chunked, rel=1e-3)
    assert chain_broadcast(size, 1, SLOW_LINK) == 0.0
    fast = Link(1e-6, 1e10)
    assert hierarchical_allreduce(size, 4, 3, fast, SLOW_LINK) == pytest.approx(
        ring_allreduce(size, 4, fast)
        + ring_allreduce(size, 3, SLOW_LINK)
        + chain_broadcast(size, 4, fast)
    )


def test_shaped_links_pass_their_burst_unpaced():
    """A token bucket of b bytes refilling at B lets L bytes leave after max(0, L - b) / B;
    each collective puts one rank's whole load on its interface through it."""
    shaped = Link(alpha=1e-4, bandwidth=1e8, burst=2e5)
    n, size = 4, 1e6
    assert ring_allreduce(size, n, shaped) == pytest.approx(6e-4 + (1.5e6 - 2e5) / 1e8)
    assert ring_allreduce(1e5, n, shaped) == pytest.approx(6e-4)  # inside the burst: latency
    assert ring_allgather(1e5, n, shaped) == pytest.approx(3e-4 + (3e5 - 2e5) / 1e8)
    assert chain_broadcast(size, n, shaped) == pytest.approx(3e-4 + (size - 2e5) / 1e8)
    assert shaped.share(0.5) == Link(1e-4, 5e7, 1e5)


def test_fit_recovers_a_shaped_link_that_a_plain_fit_cannot():
    from suite.sim.fit import fit_ring

    truth = Link(alpha=4e-4, bandwidth=2.5e7, burst=262144)
    sizes = [4096, 65536, 262144, 2**20, 2**22, 2**24]
    times = [[s, ring_allreduce(s, 2, truth)] for s in sizes]
    link, worst = fit_ring(times, 2, burst=262144)
    assert link.alpha == pytest.approx(truth.alpha)
    assert link.bandwidth == pytest.approx(truth.bandwidth)
    assert link.burst == truth.burst and worst < 1e-9
    _, worst_plain = fit_ring(times, 2)  # ignoring the bucket misprices the middle sizes
    assert worst_plain > 0.2


def test_a_slow_latency_point_does_not_tilt_a_shaped_links_rate():
    """A late peer slows the smallest all-reduce fivefold (seen on a loaded 2-core CI box);
    the rate comes from the paced sizes alone and stays the link's, not above it."""
    from suite.sim.fit import fit_ring

    truth = Link(alpha=4e-4, bandwidth=2.5e7, burst=262144)
    times = [[s, ring_allreduce(s, 2, truth)] for s in (4096, 2**20, 2**22)]
    times[0][1] *= 5
    link, _ = fit_ring(times, 2, burst=262144)
    assert link.bandwidth == pytest.approx(truth.bandwidth, rel=1e-9)
    assert link.alpha > truth.alpha  # the slow point still counts for latency


def test_groups_are_priced_on_their_links():
    intra, inter = Link(1e-6, 1e11), Link(1e-5, 1e10, burst=1e6)
    profile = Profile("t", "", 4, intra, inter, memory_bandwidth=1e11, rails=2)
    topo = sim_topology(16, 4, rank=0)
    comm = SimCommunicator(topo, recorder=None, device=torch.device("cpu"), profile=profile)
    assert comm.link(topo.intra) == intra
    assert comm.link(topo.inter) == inter  # one leader per node: one rail
    assert comm.link(topo.world) == Link(1e-5, 2e10, 2e6)  # 4 ranks per node use both rails
    assert comm.link(topo.peers) == Link(1e-5, 1e10 * 2 / 4, 1e6 * 2 / 4)  # 4 rings, 2 rails


def write_profile(tmp_path, inter_bandwidth: float) -> str:
    profile = {
        "name": "test",
        "gpus_per_node": 2,
        "links": {
            "intra": {"alpha_s": 1e-6, "bandwidth_Bps": 1e10},
            "inter": {"alpha_s": 1e-5, "bandwidth_Bps": inter_bandwidth},
        },
        "memory_bandwidth": {"bandwidth_Bps": 1e10},
        "compute": {
            "backward_fraction": 0.5,
            "overlap_efficiency": 0.8,
            "steps": {"cnn-fmnist@8": {"seconds": 0.1}},
        },
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return str(path)


SMALL = ["--workload", "cnn-fmnist", "--dataset", "synthetic", "--batch-size", "8"]


def simulate(tmp_path, profile, *args) -> pd.DataFrame:
    out = tmp_path / "sim"
    proc = bench("sim", *SMALL, "--profile", profile, "--results-dir", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["simulated"] is True and summary["final_accuracy"] is None
    return pd.read_parquet(folder / "iterations.parquet")


def test_ddp_buckets_hide_behind_backward_as_a_pipeline(tmp_path):
    """t_iteration = compute + allreduce - overlap * (what the bucket pipeline hides)."""
    from suite.sim.pricing import pipelined_hidden

    for bandwidth in (1e10, 1e6):  # comm shorter, then longer, than the backward pass
        rows = simulate(
            tmp_path / str(bandwidth),
            write_profile(tmp_path, bandwidth),
            "--method",
            "ddp",
            "--gpus",
            "4",
            "--gpus-per-node",
            "2",
            "--iterations",
            "2",
        )
        row = rows.iloc[0]
        hidden = 0.8 * pipelined_hidden([row.t_allreduce], 0.5 * row.t_local_compute)
        assert row.t_local_compute == pytest.approx(0.1)
        assert row.t_iteration == pytest.approx(0.1 + row.t_allreduce - hidden)
    assert row.t_allreduce > 0.05  # the slow link could not hide


def test_bucket_pipeline_closed_forms():
    from suite.sim.pricing import pipelined_hidden

    assert pipelined_hidden([0.3], 1.0) == pytest.approx(
        0.0
    )  # one bucket: ready when backward ends
    assert pipelined_hidden([], 1.0) == 0.0 and pipelined_hidden([0.3], 0.0) == 0.0
    # n equal buckets, bucket i ready at i/n of the backward pass: if each fits in its
    # interval (t <= 1/n) only the last is exposed; if not, the wire is the bottleneck and
    # everything after the first bucket's ready time shows beyond the backward pass
    n, backward = 10, 1.0
    assert pipelined_hidden([0.05] * n, backward) == pytest.approx(0.45)
    t = 0.3
    exposed = backward / n + n * t - backward
    assert pipelined_hidden([t] * n, backward) == pytest.approx(n * t - exposed)
    # brute force: an event-by-event walk of the same rule
    buckets = [0.02, 0.3, 0.05, 0.2, 0.01]
    ready, free = [backward * sum(buckets[: i + 1]) / sum(buckets) for i in range(5)], 0.0
    for r, b in zip(ready, buckets):
        free = max(free, r) + b
    assert pipelined_hidden(buckets, backward) == pytest.approx(sum(buckets) - (free - backward))


def real_run(tmp_path, *args) -> tuple[pd.DataFrame, str]:
    out = tmp_path / "real"
    proc = bench(
        "run", *SMALL, "--gpus", "4", "--gpus-per-node", "2", "--results-dir", str(out), *args
    )
    assert proc.returncode == 0, proc.stderr
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return pd.read_parquet(folder / "iterations.parquet"), str(folder)


BYTES = ["iteration", "rank", "bytes_intra", "bytes_inter"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, extra",
    [pytest.param("ddp", [], marks=pytest.mark.integration),  # minutes: nox -s integration
     pytest.param("topk-hier", [], marks=pytest.mark.integration),
     ("prunex", ["--local-steps", "2", "--freeze-round", "2"])],
)
def test_simulated_bytes_equal_a_real_2x2_run(tmp_path, method, extra):
    real, folder = real_run(tmp_path, "--method", method, "--iterations", "4", *extra)
    sim_args = ["--method", method, "--gpus", "4", "--gpus-per-node", "2", "--iterations", "4"]
    if method == "prunex":  # the real masks froze after round 2; replay with them
        sim_args += ["--local-steps", "2", "--masks-from", folder]
        real = real[real.iteration >= 2]
    sim = simulate(tmp_path, write_profile(tmp_path, 1e9), *sim_args)
    sim = sim[sim.iteration.isin(real.iteration.unique())]
    pd.testing.assert_frame_equal(
        real[BYTES].reset_index(drop=True), sim[BYTES].reset_index(drop=True), check_dtype=False
    )
    assert real.bytes_inter.sum() > 0


def test_bad_simulator_input_is_one_line(tmp_path):
    for args, expected in [
        (["--profile", "nope"], "no profile 'nope'"),
        (["--method", "localsgd-hier"], "cannot replay localsgd-hier"),
        (["--gpus", "6", "--gpus-per-node", "4"], "not divisible"),
    ]:
        proc = bench("sim", *SMALL, "--results-dir", str(tmp_path), "--iterations", "1", *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr


@pytest.mark.parametrize("n", [2, 4, 16, 64])
def test_straggler_wait_is_the_expected_maximum_of_normals(n):
    from suite.sim.profile import expected_max_of_normals

    sampled = torch.randn(200_000, n, generator=torch.Generator().manual_seed(0)).amax(1).mean()
    assert expected_max_of_normals(n) == pytest.approx(float(sampled), rel=0.03)
    assert expected_max_of_normals(1) == 0.0


def test_sync_wait_follows_the_measured_curve_and_scales_with_ranks(tmp_path):
    from suite.sim.profile import expected_max_of_normals, load_profile

    data = json.loads(open(write_profile(tmp_path, 1e9)).read())
    step = data["compute"]["steps"]["cnn-fmnist@8"]
    step.update(jitter_s=0.01, sync_wait_s=[[1, 0.02], [4, 0.08], [16, 0.16]], sync_wait_ranks=4)
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(data))
    profile = load_profile(str(path))
    assert profile.sync_wait("cnn-fmnist", 8, 4, 4) == pytest.approx(0.08)
    assert profile.sync_wait("cnn-fmnist", 8, 2, 4) == pytest.approx(0.04)  # log-log: k^1
    assert profile.sync_wait("cnn-fmnist", 8, 8, 4) == pytest.approx(0.08 * 2**0.5)  # k^0.5
    assert profile.sync_wait("cnn-fmnist", 8, 64, 4) == pytest.approx(0.32)  # end slope
    ratio = expected_max_of_normals(64) / expected_max_of_normals(4)
    assert profile.sync_wait("cnn-fmnist", 8, 4, 64) == pytest.approx(0.08 * ratio)
    assert profile.sync_wait("cnn-fmnist", 8, 4, 1) == 0.0
    del step["sync_wait_s"]  # only a step deviation: independent normal steps
    path.write_text(json.dumps(data))
    derived = load_profile(str(path)).sync_wait("cnn-fmnist", 8, 9, 4)
    assert derived == pytest.approx(0.01 * 3 * expected_max_of_normals(4))


def test_simulated_iterations_wait_for_the_slowest_rank(tmp_path):
    data = json.loads(open(write_profile(tmp_path, 1e9)).read())
    data["compute"]["steps"]["cnn-fmnist@8"].update(
        sync_wait_s=[[1, 0.01], [4, 0.04]], sync_wait_ranks=4
    )
    path = tmp_path / "waits.json"
    path.write_text(json.dumps(data))
    args = ["--method", "prunex", "--local-steps", "4", "--gpus", "4", "--iterations", "2"]
    rows = simulate(tmp_path, str(path), *args)
    assert rows.t_straggler_wait.tolist() == pytest.approx([0.04] * len(rows))
    phases = [c for c in rows.columns if c.startswith("t_") and c != "t_iteration"]
    leader = rows[rows["rank"] == 0].iloc[-1]
    assert leader.t_iteration == pytest.approx(leader[phases].sum(), rel=1e-6)


def test_block_statistics():
    from suite.sim.fit import block_statistics

    # 2 block sizes x 2 repeats, 2 ranks
    seconds = [[0.1, 0.3], [0.2, 0.2], [0.8, 1.2], [1.0, 1.0]]
    per_step, waits, by_size = block_statistics([1, 4], 2, seconds)
    assert per_step == pytest.approx((0.2 + 0.2 + 1.0 + 1.0) / 10)
    assert waits == [[1, pytest.approx(0.05)], [4, pytest.approx(0.1)]]
    assert by_size == [[1, pytest.approx(0.2)], [4, pytest.approx(0.25)]]


@pytest.mark.integration  # a minute of calibration: nox -s integration
def test_calibrate_writes_a_profile_the_simulator_runs_with(tmp_path):
    """A real 2 x 2 calibration on loopback: fitted links, measured compute and waits. The sizes
    lie 256x apart so that scheduling noise of 4 ranks on 2 cores cannot hide the slope."""
    out = tmp_path / "cpu.json"
    proc = bench(
        "calibrate", "--gpus", "4", "--gpus-per-node", "2", "--workload", "cnn-fmnist",
        "--batch-size", "8", "--steps", "3", "--repeats", "5", "--sizes", "65536,16777216",
        "--sync-blocks", "1,4", "--block-repeats", "2", "-o", str(out),
    )
    assert proc.returncode == 0, proc.stderr
    profile = json.loads(out.read_text())
    for link in ("intra", "inter"):
        assert profile["links"][link]["bandwidth_Bps"] > 0
        assert len(profile["links"][link]["measurements"]) == 2
    step = profile["compute"]["steps"]["cnn-fmnist@8"]
    assert step["seconds"] > 0 and step["sync_wait_ranks"] == 4
    assert [k for k, _ in step["sync_wait_s"]] == [1, 4]
    assert all(w >= 0 for _, w in step["sync_wait_s"])
    rows = simulate(tmp_path, str(out), "--method", "ddp", "--gpus", "4", "--iterations", "2")
    assert rows.t_local_compute.iloc[0] == pytest.approx(step["seconds"])
    assert (rows.t_straggler_wait > 0).all()

    again = tmp_path / "again.json"  # compute re-timed, links kept
    proc = bench(
        "calibrate", "--gpus", "4", "--workload", "cnn-fmnist", "--batch-size", "8",
        "--steps", "3", "--sync-blocks", "2", "--block-repeats", "2", "--compute-only",
        "--links-from", str(out), "-o", str(again),
    )
    assert proc.returncode == 0, proc.stderr
    retimed = json.loads(again.read_text())
    assert retimed["links"]["inter"]["bandwidth_Bps"] == profile["links"]["inter"]["bandwidth_Bps"]
    assert [k for k, _ in retimed["compute"]["steps"]["cnn-fmnist@8"]["sync_wait_s"]] == [2]


@pytest.mark.integration  # ResNet-152's replay: nox -s integration
def test_simulator_sends_only_live_weights_of_resnet152(tmp_path):
    """Issue 14's measure, from the method's own step code: PruneX at channel keep 0.5 on
    ResNet-152 packs at most 0.33 x the dense bytes per round (about 0.50 with each conv's
    own mask block, ``--pack dense-masks``), and exactly the live slices of its masks."""
    from suite.data.datasets import dataset_spec
    from suite.data.workload import example_input
    from suite.structured.groups import trace_channel_groups
    from suite.structured.liveness import live_slices
    from suite.structured.masks import StructuredMask
    from suite.structured.packing import model_entries, packed_numel
    from workloads.models import resnet152

    proc = bench("sim", "--method", "prunex", "--workload", "resnet152-cifar10", "--gpus", "8",
                 "--gpus-per-node", "4", "--iterations", "1", "--replay", "1", "--local-steps",
                 "1", "--batch-size", "2", "--channel-keep", "0.5", "--results-dir",
                 str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.iterdir()
    packed = pd.read_parquet(run / "iterations.parquet").packed_bytes.iloc[0]
    spec = dataset_spec("cifar10")
    model = resnet152(spec)
    saved = torch.load(run / "masks.pt", weights_only=True)
    masks = {n: StructuredMask.from_state(m) for n, m in saved.items()}
    live = live_slices(model, trace_channel_groups(model, example_input(spec)), masks)

    def layout_bytes(entries):
        return 4 * sum(packed_numel(shape, keep) for _, shape, keep in entries)

    dense = layout_bytes(model_entries(model, {}))
    assert packed == layout_bytes(model_entries(model, masks, live=live))
    assert packed / dense <= 0.33
    assert 0.49 < layout_bytes(model_entries(model, masks)) / dense < 0.52


def simulated_runs(out) -> dict:
    runs = {}
    for path in out.rglob("summary.json"):
        summary = json.loads(path.read_text())
        rows = pd.read_parquet(path.parent / "iterations.parquet")
        manifest = json.loads((path.parent / "manifest.json").read_text())
        runs[summary["method"]] = (summary, rows[rows["rank"] == 0], manifest)
    return runs


def test_a_cut_last_round_is_priced_as_its_own_replay(tmp_path, monkeypatch):
    """A budget that cuts PruneX's last round (39 steps in rounds of 4: the last of 3): the
    simulation replaying one iteration prices training as the one replaying every iteration
    (within 2 %: host-timed phases vary; the host's bandwidth that scales them is fixed, as
    two simulations made apart on a loaded runner would otherwise measure it apart), and
    every simulation prices the samples it trains."""
    monkeypatch.setenv("PRUNEX_HOST_MEMORY_BANDWIDTH", "2e10")
    profile = write_profile(tmp_path, 1e8)
    found = {}
    for replay in ("1", "1000"):
        out = tmp_path / replay
        proc = bench("sim", *SMALL, "--profile", profile, "--results-dir", str(out),
                     "--method", "prunex,ddp", "--gpus", "4", "--local-steps", "4",
                     "--epochs", "0.3", "--replay", replay)
        assert proc.returncode == 0, proc.stderr
        found[replay] = simulated_runs(out)
    for method in ("prunex", "ddp"):
        (short, rows, manifest), (full, _, full_manifest) = (found["1"][method],
                                                             found["1000"][method])
        assert rows.samples.sum() == short["samples_per_rank"] == full["samples_per_rank"]
        assert short["train_seconds"] == pytest.approx(full["train_seconds"], rel=0.02)
        replayed = manifest["simulation"]["replayed_iterations"]
        assert 1 < replayed < full_manifest["simulation"]["replayed_iterations"], method
        assert manifest["simulation"]["host_memory_bandwidth_Bps"] == 2e10
    prunex_rows = found["1"]["prunex"][1]
    assert prunex_rows.samples.iloc[-1] < prunex_rows.samples.iloc[0]  # the cut round


def test_rounds_that_change_with_the_gpu_count_are_named_with_the_fixed_form(tmp_path):
    proc = bench("sim", *SMALL, "--method", "prunex,ddp", "--gpus", "4,64", "--dry-run",
                 "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("warning: prunex's rounds"))
    assert "H=32 at 4" in line and "at 64" in line and "--local-steps " in line, line
    assert "ddp's rounds" not in proc.stderr


@pytest.mark.integration  # 12 simulations of ResNet-18: half a minute
def test_the_docs_scaling_example_stays_within_efficiency_one(tmp_path):
    """docs/commands/sim.md's first example at --replay 1: no method simulates a parallel
    efficiency above 1 (the short last round of 8 GPUs once priced as a whole one: 1.34)."""
    proc = bench("sim", "--method", "prunex,ddp,topk", "--gpus", "8,16,32,64", "--profile",
                 "v100-ib100", "--workload", "resnet18-cifar10", "--replay", "1",
                 "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "above 1" not in proc.stderr, proc.stderr
    per_method: dict = {}
    for summary in (json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")):
        per_method.setdefault(summary["method"], {})[summary["gpus"]] = (
            summary["train_seconds"] / summary["epochs"])
    assert set(per_method) == {"prunex", "ddp", "topk"}
    for seconds in per_method.values():
        for gpus, epoch_seconds in seconds.items():
            assert seconds[8] / epoch_seconds / (gpus / 8) <= 1.01
