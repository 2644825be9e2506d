"""A single-process H-SADMM that simulates all M x P workers with plain tensors.

It shares only the per-layer math (hsadmm.py) with the distributed method; the schedule,
the consensus over nodes and the mask union are written out directly, dense, with no
packing, so agreement with the 4-process run checks the communication schedule end to end.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from methods.prunex import hsadmm
from methods.prunex.blocks import admm_blocks, averaged_buffers
from suite.structured.masks import StructuredMask, apply_mask, project


def reference_rounds(
    make_model,
    make_loader,
    *,
    nodes,
    procs,
    rounds,
    local_steps,
    lr,
    momentum,
    lam,
    rho1,
    rho2,
    keeps,
    freeze_round=None,
    average_period=None,
):
    """Returns the global z (list, in block order) after ``rounds`` rounds (fixed rho).

    ``average_period`` K: the node's models (parameters and BN statistics) are averaged
    after every K-th local step of a round and theta after its last one (the node mean),
    as ``--intra-average-period`` does."""
    workers = nodes * procs
    models = [make_model() for _ in range(workers)]
    blocks = admm_blocks(models[0])
    buffer_names = averaged_buffers(models[0])
    loaders = [iter(make_loader(r)) for r in range(workers)]
    params = [[dict(m.named_parameters())[b.name] for b in blocks] for m in models]
    opts = [torch.optim.SGD(p, lr=lr, momentum=momentum) for p in params]
    z = [p.detach().clone() for p in params[0]]
    z_node = [[t.clone() for t in z] for _ in range(nodes)]
    u = [[torch.zeros_like(t) for t in z] for _ in range(workers)]
    v = [[torch.zeros_like(t) for t in z] for _ in range(nodes)]
    masks = {i: StructuredMask.full(b.shape) for i, b in enumerate(blocks) if b.constrained}
    frozen = False
    averaging = average_period is not None and 0 < average_period < local_steps

    def node_mean(names_of, node):
        """The node's workers' tensors := their mean (``names_of(w)``: a worker's tensors)."""
        ranks = range(node * procs, (node + 1) * procs)
        for tensors in zip(*(names_of(w) for w in ranks)):
            mean = sum(tensors) / procs
            for t in tensors:
                t.copy_(mean)

    for k in range(rounds):
        anchors = [[zi - uu for zi, uu in zip(z_node[w // procs], u[w])] for w in range(workers)]
        for step in range(1, local_steps + 1):
            for w in range(workers):
                x, y = next(loaders[w])
                opts[w].zero_grad()
                nn.functional.cross_entropy(models[w](x), y).backward()
                opts[w].step()
                with torch.no_grad():  # the exact proximal step of rho1/2 ||p - a||^2
                    for p, a in zip(params[w], anchors[w]):
                        p.copy_((p + lr * rho1 * a) / (1 + lr * rho1))
                if frozen:  # retraining on the fixed support
                    with torch.no_grad():
                        for b_idx, m in masks.items():
                            params[w][b_idx].mul_(m.dense())
            if averaging and (step % average_period == 0 or step == local_steps):
                with torch.no_grad():
                    for node in range(nodes):
                        node_mean(lambda w: [p.data for p in params[w]], node)
                        if step < local_steps:  # the round's end averages BN statistics anyway
                            node_mean(lambda w: [dict(models[w].named_buffers())[n]
                                                 for n in buffer_names], node)
        with torch.no_grad():
            new_node, local_masks = [], []
            for i in range(nodes):
                ranks = range(i * procs, (i + 1) * procs)
                zi, mi = [], {}
                for b_idx, block in enumerate(blocks):
                    s = sum(params[w][b_idx] + u[w][b_idx] for w in ranks)
                    cand = hsadmm.node_candidate(
                        s,
                        z[b_idx],
                        v[i][b_idx],
                        rho1=rho1,
                        rho2=rho2,
                        lam=lam,
                        num_nodes=nodes,
                        procs_per_node=procs,
                    )
                    if block.constrained:
                        if frozen:
                            cand = apply_mask(cand, masks[b_idx])
                        else:
                            cand, mi[b_idx] = project(cand, **keeps)
                    zi.append(cand)
                new_node.append(zi)
                local_masks.append(mi)
            if not frozen:
                for b_idx in masks:
                    union = local_masks[0][b_idx]
                    for mi in local_masks[1:]:
                        union = union.union(mi[b_idx])
                    masks[b_idx] = union
            new_z = []
            for b_idx, block in enumerate(blocks):
                mean = sum(new_node[i][b_idx] + v[i][b_idx] for i in range(nodes)) / nodes
                if block.constrained:
                    keep = torch.zeros(block.shape, dtype=torch.bool)
                    kf, kc = masks[b_idx].kept_filters(), masks[b_idx].kept_channels()
                    keep[kf[:, None], kc[None, :]] = True
                    mean = mean * keep
                new_z.append(mean)
            for i in range(nodes):
                for b_idx in range(len(blocks)):
                    v[i][b_idx] += new_node[i][b_idx] - new_z[b_idx]
            for w in range(workers):
                for b_idx in range(len(blocks)):
                    u[w][b_idx] += params[w][b_idx] - new_node[w // procs][b_idx]
            for name in buffer_names:
                mean = sum(dict(m.named_buffers())[name] for m in models) / workers
                for m in models:
                    dict(m.named_buffers())[name].copy_(mean)
            z, z_node = new_z, new_node
        if freeze_round is not None and k + 1 >= freeze_round and not frozen:
            frozen = True
            with torch.no_grad():
                for b_idx, m in masks.items():
                    dense = m.dense().float()
                    for w in range(workers):
                        params[w][b_idx].mul_(dense)
                        u[w][b_idx].mul_(dense)
                        opts[w].state[params[w][b_idx]]["momentum_buffer"].mul_(dense)
    return z, copy.deepcopy(masks)
