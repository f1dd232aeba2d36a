"""A plain torch DDP training script, run on hpctrain's communication.

    mpiexec -n 4 python examples/ddp/train.py [--epochs 3] [--max-steps N]
    srun --mpi=pmix -N 2 --ntasks-per-node=4 python examples/ddp/train.py

Everything here is ordinary DDP (torchrun's LOCAL_RANK, DistributedSampler, DDP, metric
all_reduce) except the lines marked ``# hpctrain``: the import, ``init_process_group`` (torch's
needs MASTER_ADDR/MASTER_PORT and RANK/WORLD_SIZE from a launcher; this one takes them from MPI)
and the hook registration (DDP's gradient buckets averaged by hpctrain: shared memory within a
node, fp16 on the wire with ``--fp16``). Without the marked lines it is the same script for
torchrun. The data is a synthetic 10-class problem (Gaussian blobs), so it runs anywhere.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import hpctrain.ddp  # hpctrain


def blobs(n: int = 4096, dim: int = 64, classes: int = 10, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g) * 0.3
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, dim, generator=g), y)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: whole epochs)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--fp16", action="store_true", help="fp16 gradient wire")
    args = p.parse_args()

    hpctrain.ddp.init_process_group()  # hpctrain: instead of dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10)).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    hpctrain.ddp.register(model, compression="fp16" if args.fp16 else "none")  # hpctrain
    opt = torch.optim.SGD(model.parameters(), lr=0.05 * world, momentum=0.9)

    data = blobs()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        stats = torch.zeros(3, device=device)          # loss sum, correct, samples
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            stats += torch.stack([loss.detach() * len(y), (out.argmax(1) == y).sum(), torch.tensor(len(y))])
            step += 1
            if args.max_steps and step >= args.max_steps:
                break
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch} loss {stats[0] / stats[2]:.4f} accuracy {stats[1] / stats[2]:.4f}", flush=True)
        if args.max_steps and step >= args.max_steps:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
