"""Single-process check of a Fashion-MNIST recipe: why the CPU workloads don't use the paper's.

    python benchmarks/recipe_check.py BATCH LR STEPS
e.g. ``512 1e-3 117`` (the paper's recipe on 4 ranks, one epoch) vs ``128 0.05 468``.
Prints batch, lr, steps, test accuracy and seconds per step (one thread).
"""

import sys
import time

import torch
from torch import nn

from suite.data.datasets import load_data
from workloads.models import small_cnn


def main() -> None:
    torch.set_num_threads(1)
    batch, lr, steps = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    train, test, spec = load_data("fmnist")
    torch.manual_seed(0)
    model = small_cnn(spec)
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
