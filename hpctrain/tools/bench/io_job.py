"""The last row of ``python -m hpctrain bench io`` (:mod:`hpctrain.tools.bench.io`): the data-wait share of
the default job's training step, with its own loader, model and allreduce.

Apart from the read rows: it trains (torch), they only read.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI


def data_wait_share(comm, topo, steps: int, driver: str | None = None) -> dict:
    """Train the default job's model (digits CNN, global batch 64) and time the loader waits."""
    import torch

    from hpctrain.models import build_model
    torch.set_num_threads(1)
    from hpctrain.data import train_loader
    from hpctrain.job.config import Config, set_value
    from hpctrain.job.setup import data_index, loader_keywords
    cfg = Config()                                        # the default job's data options
    for key, value in (("train.batch_size", 64), ("train.seed", 0), ("data.hdf5_driver", driver)):
        if value is not None:
            set_value(cfg, key, value)
    idx = data_index(cfg, topo)
    ld = train_loader(idx, topo, **loader_keywords(cfg, topo.size))
    driver = ld.shards.driver
    torch.manual_seed(0)
    model = build_model("digits_cnn", num_classes=idx.num_classes, in_channels=idx.sample_shape[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    done, epoch, t0 = 0, 0, time.perf_counter()
    ld.stats.reset()
    while done < steps:
        for x, y in ld.epoch(epoch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            for p in model.parameters():          # the gradient mean, as the flat strategy computes it
                assert p.grad is not None
                g = p.grad.numpy()
                comm.Allreduce(MPI.IN_PLACE, g)
                g /= topo.size
            opt.step()
            done += 1
            if done >= steps:
                break
        epoch += 1
    total = time.perf_counter() - t0
    ld.close()
    shares = comm.allgather(ld.stats.wait_s / total)
    return {"steps": done, "step_ms": 1e3 * total / done, "driver": driver, "wait_share_max": max(shares),
            "wait_share_mean": float(np.mean(shares))}
