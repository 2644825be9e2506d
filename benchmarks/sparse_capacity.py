"""Dense SGD on the sparse architecture a PruneX run found, at a given data budget.

Separates the capacity of the pruned network from ADMM's convergence: if training the same
support directly reaches what PruneX's z reaches, the gap to dense DDP is the price of the
sparsity, not of the algorithm.

    python benchmarks/sparse_capacity.py RUN_DIR [EPOCHS] [BATCH] [LR]

RUN_DIR is a cnn-fmnist PruneX run folder (its masks.pt). Prints test accuracy per epoch.
"""

import sys
from pathlib import Path

import torch
from torch import nn

from workloads.datasets import load_data
from workloads.models import small_cnn


def main() -> None:
    run = Path(sys.argv[1])
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    lr = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
    train, test, spec = load_data("fmnist")
    masks = {
        name: m["dense"].float()
        for name, m in torch.load(run / "masks.pt", weights_only=True).items()
    }
    torch.manual_seed(0)
    model = small_cnn(spec)
    params = dict(model.named_parameters())

    def restrict() -> None:
        with torch.no_grad():
            for name, mask in masks.items():
                params[name].mul_(mask)

    restrict()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(0)
    for epoch in range(epochs):
        order = torch.randperm(len(train), generator=generator)
        model.train()
        for step in range(len(train) // batch):
            idx = order[step * batch : (step + 1) * batch]
            loss = nn.functional.cross_entropy(model(train.images[idx]), train.labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            restrict()
        model.eval()
        with torch.no_grad():
            correct = sum(
                (model(test.images[i : i + 2000]).argmax(1) == test.labels[i : i + 2000])
                .sum()
                .item()
                for i in range(0, len(test), 2000)
            )
        print(f"epoch {epoch + 1}: accuracy {correct / len(test):.4f}", flush=True)


if __name__ == "__main__":
    main()
