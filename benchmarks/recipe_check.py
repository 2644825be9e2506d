"""Single-process check of a Fashion-MNIST recipe: why the CPU workloads don't use the paper's.

    python benchmarks/recipe_check.py BATCH LR STEPS
e.g. ``512 1e-3 117`` (the paper's recipe on 4 ranks, one epoch) vs ``128 0.05 468``.
Prints batch, lr, steps, test accuracy and seconds per step (one thread).

The model is cnn-fmnist's (``WORKLOADS``), the data Fashion-MNIST as the suite reads it
(``DATASETS``). ``--smoke`` runs 3 steps of batch 32 on 256 random images of Fashion-MNIST's
shape instead (its accuracy means nothing):

    python benchmarks/recipe_check.py --smoke
"""

import argparse
import time

import torch
from torch import nn

from suite.api import DATASETS, WORKLOADS, TensorData

#: --smoke: batch, lr, steps where none are given
SMOKE = (32, 0.05, 3)


def random_data(spec, train: int, test: int) -> tuple[TensorData, TensorData]:
    """Random normalized images and labels of the dataset's shape (for --smoke)."""
    g = torch.Generator().manual_seed(0)

    def split(n: int) -> TensorData:
        images = torch.randn(n, spec.in_chans, spec.image_size, spec.image_size, generator=g)
        return TensorData(images, torch.randint(0, spec.num_classes, (n,), generator=g))

    return split(train), split(test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batch", type=int, nargs="?", help="batch size")
    parser.add_argument("lr", type=float, nargs="?", help="learning rate")
    parser.add_argument("steps", type=int, nargs="?", help="SGD steps")
    parser.add_argument("--smoke", action="store_true",
                        help=f"random data; batch, lr, steps {SMOKE} unless given")
    args = parser.parse_args()
    given = (args.batch, args.lr, args.steps)
    if None in given and not args.smoke:
        parser.error("give BATCH LR STEPS")
    batch, lr, steps = (g if g is not None else d for g, d in zip(given, SMOKE))
    torch.set_num_threads(1)
    fmnist = DATASETS.get("fmnist")
    spec = fmnist.spec
    train, test = random_data(spec, 256, 64) if args.smoke else fmnist.load(None, False)
    torch.manual_seed(0)
    model = WORKLOADS.get("cnn-fmnist").factory().build_model(spec)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    usable = len(train) // batch * batch
    start = time.time()
    for step in range(steps):
        idx = order[(step * batch) % usable :][:batch]
        loss = nn.functional.cross_entropy(model(train.images[idx]), train.labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds = (time.time() - start) / steps
    model.eval()
    with torch.no_grad():
        correct = sum(
            (model(test.images[i : i + 1000]).argmax(1) == test.labels[i : i + 1000]).sum().item()
            for i in range(0, len(test), 1000)
        )
    print(batch, lr, steps, correct / len(test), round(seconds, 3))


if __name__ == "__main__":
    main()
