"""PruneX on a MobileNet-family model (depthwise convs, squeeze-excitation with conv biases,
hardswish, BatchNorm after every conv): its consensus is the one Algorithm 1 defines (the
single-process reference), the evaluated consensus carries BatchNorm statistics of itself, not
of the ranks' models, and it evaluates about as well as hierarchical local SGD."""

from __future__ import annotations

import pytest
import torch
from timm.models._efficientnet_blocks import SqueezeExcite
from torch import nn

from baselines.localsgd import HierarchicalLocalSGD
from methods.prunex.method import PruneX
from suite.data.sharding import ShardedLoader
from tests.support.distributed import run_ranks
from tests.support.helpers import make_context, run_iterations, tiny_data
from tests.support.prunex_reference import reference_rounds

#: rounds of the accuracy comparison; the comparison with the reference runs two (float
#: summation orders differ, and on this model at this lr such differences grow every round)
ROUNDS, STEPS, LR = 6, 4, 0.1


class TinyMobileNet(nn.Module):
    """A stem and three inverted-residual-style blocks: depthwise conv, BN, hardswish,
    squeeze-excitation (convs with biases), pointwise conv, BN."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.Hardswish())
        blocks = []
        for _ in range(3):
            blocks += [nn.Conv2d(width, width, 3, padding=1, groups=width, bias=False),
                       nn.BatchNorm2d(width), nn.Hardswish(), SqueezeExcite(width, rd_ratio=0.25),
                       nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width)]
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(width, 4)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def mobilenet():
    torch.manual_seed(0)
    return TinyMobileNet()


def accuracy(model: nn.Module) -> float:
    """On the training images (the helpers' task is defined by its samples' class means)."""
    test = tiny_data()
    model.eval()
    with torch.no_grad():
        return (model(test.images).argmax(1) == test.labels).float().mean().item()


def prunex_worker(rank, options, rounds=ROUNDS):
    ctx = make_context(rank, gpus_per_node=2, method="prunex", options=options,
                       model_fn=mobilenet, lr=LR, budget_steps=rounds * STEPS)
    method = PruneX(ctx, hierarchical=True)
    run_iterations(method, ctx.recorder, rounds)
    method.summary_facts()  # the end of the run: its warnings
    evaluated = method.eval_model()
    batch = tiny_data().images
    with torch.no_grad():
        eval_mode = evaluated.eval()(batch)
        train_mode = evaluated.train()(batch)  # BN on the batch's own statistics
    evaluated.eval()
    return {"z": [t.clone() for t in method.z], "accuracy": accuracy(evaluated),
            "logits": (eval_mode, train_mode), "warnings": list(method.warnings),
            "density": method.density()}


def localsgd_worker(rank):
    ctx = make_context(rank, gpus_per_node=2, method="localsgd-hier", model_fn=mobilenet,
                       options={"local_steps": STEPS}, lr=LR)
    method = HierarchicalLocalSGD(ctx)
    run_iterations(method, ctx.recorder, ROUNDS)
    return accuracy(method.eval_model())


# keep 1.0 prunes nothing, so its masks freeze at once; --after-freeze admm keeps every round
# Algorithm 1's (masking by all-ones changes nothing)
REFERENCE = {"channel_keep": 1.0, "local_steps": STEPS, "adaptive_rho": False, "rho1": 1.5e-3,
             "rho2": 1.5e-4, "pack": "dense-masks", "after_freeze": "admm"}
UNFROZEN = {"channel_keep": 1.0, "local_steps": STEPS, "after_freeze": "admm"}
PRUNED = {"channel_keep": 0.5, "local_steps": STEPS, "freeze_patience": 100}
#: name: (PruneX options, rounds); None: hierarchical local SGD
CONFIGURATIONS = {
    "reference": (REFERENCE, 2),
    "own-bn": (UNFROZEN, 2),
    "averaged-bn": ({**UNFROZEN, "consensus_bn": "averaged"}, 2),
    "keep-1": ({"channel_keep": 1.0, "local_steps": STEPS}, ROUNDS),
    "localsgd": None,
    "pruned-trained": (PRUNED, ROUNDS),
    "pruned-untrained": ({**PRUNED, "freeze_share": 1.0}, ROUNDS),
}


def every_configuration(rank):
    """One set of 4 ranks runs each configuration in turn (spawning ranks costs more than
    these runs); rank 0's results by name."""
    return {name: localsgd_worker(rank) if spec is None else prunex_worker(rank, *spec)
            for name, spec in CONFIGURATIONS.items()}


@pytest.fixture(scope="module")
def runs():
    return run_ranks(every_configuration, 4)[0]


def test_the_consensus_is_algorithm_1s(runs):
    z_ref, _ = reference_rounds(
        mobilenet, lambda r: ShardedLoader(tiny_data(), r, 4, 8, 0), nodes=2, procs=2,
        rounds=2, local_steps=STEPS, lr=LR, momentum=0.9, lam=1e-4, rho1=1.5e-3,
        rho2=1.5e-4, keeps={"channel_keep": 1.0},
    )
    # depthwise, SE biases, BN affine: all blocks
    for got, want in zip(runs["reference"]["z"], z_ref):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_evaluated_consensus_carries_its_own_bn_statistics(runs):
    """The cause of the chance-level MobileNetV3: the ranks' BN statistics, averaged,
    describe the ranks' models, not the consensus z. With z's own (estimated on z), its
    eval-mode logits are close to those on the batch's own statistics, and it classifies;
    with the averaged ones they are not, and it does not (two rounds of Algorithm 1, before
    any freeze)."""
    own, averaged = runs["own-bn"], runs["averaged-bn"]

    def mismatch(out) -> float:
        eval_mode, train_mode = out["logits"]
        return float((eval_mode - train_mode).abs().max() / train_mode.abs().max())

    assert mismatch(own) < 0.25 and own["accuracy"] > 0.9
    assert mismatch(averaged) > 0.5 and averaged["accuracy"] < own["accuracy"] - 0.3


def test_it_evaluates_about_as_well_as_hierarchical_local_sgd(runs):
    localsgd = runs["localsgd"]
    assert localsgd > 0.6  # learnable: the class sets the mean image
    assert runs["keep-1"]["accuracy"] >= localsgd - 0.05


def test_a_pruned_consensus_trains_on_its_support_before_it_is_evaluated(runs):
    """The second cause: before the freeze the evaluated z is the projection of the ranks'
    dense models, never trained masked. --freeze-share (default 0.25) leaves it the rest of
    the run; a run that never trains it says so in its warnings."""
    trained, untrained = runs["pruned-trained"], runs["pruned-untrained"]
    assert trained["density"] < 0.9 and not trained["warnings"]
    assert any("never trained on its support" in w for w in untrained["warnings"])
    # this task is easy enough that the untrained projection still classifies (MobileNetV3
    # small on Fashion-MNIST does not: benchmarks/measured/models.md); trained is better
    assert trained["accuracy"] > untrained["accuracy"]
