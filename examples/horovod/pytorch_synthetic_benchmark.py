"""Synthetic-data training throughput, written as a Horovod user writes it.

    mpiexec -n 2 python examples/horovod/pytorch_synthetic_benchmark.py --model resnet50
    mpiexec -n 2 python examples/horovod/pytorch_synthetic_benchmark.py --model mlp --fp16-allreduce

With Horovod installed, the same file runs under ``horovodrun`` once the import line reads
``import horovod.torch as hvd``. Models come from torchvision where it imports; PyPI's
torchvision is built for torch's CUDA wheel and fails to load beside the CPU wheel, so the same
ResNet definitions are then taken from hpctrain's model zoo. ``mlp`` is a communication-heavy
model (12.7 M parameters, little compute): it shows what the gradient allreduce costs.
"""
import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim
from torch import nn

import hpctrain.horovod.torch as hvd

try:
    from torchvision import models
except Exception:           # not installed, or its operators do not load beside this torch
    from hpctrain.models import resnet as models


def mlp(num_classes=1000, in_features=3 * 32 * 32, width=2048, depth=3):
    """Wide fully connected layers: many gradients for little compute."""
    layers, n_in = [nn.Flatten()], in_features
    for _ in range(depth):
        layers += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    return nn.Sequential(*layers, nn.Linear(n_in, num_classes))


parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--model", default="resnet50", help="a torchvision model name, or mlp")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
parser.add_argument("--image-size", type=int, default=224, help="height and width of the images")
parser.add_argument("--num-classes", type=int, default=1000)
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression in allreduce")
parser.add_argument("--num-warmup-batches", type=int, default=10, help="batches not timed")
parser.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per timed iteration")
parser.add_argument("--num-iters", type=int, default=10, help="timed iterations")
parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even where CUDA is present")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
torch.manual_seed(42)
if args.cuda:
    torch.cuda.set_device(hvd.local_rank())        # one GPU per rank on a node
else:
    torch.set_num_threads(1)                        # one core per rank

if args.model == "mlp":
    model = mlp(args.num_classes, 3 * args.image_size ** 2)
else:
    model = getattr(models, args.model)(num_classes=args.num_classes)
if args.cuda:
    model.cuda()

# Gradients are averaged over ranks, so the learning rate grows with the number of ranks.
optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size())
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.randint(0, args.num_classes, (args.batch_size,))
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


device = "GPU" if args.cuda else "CPU"
log(f"Model: {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")
log(f"Batch size: {args.batch_size} per rank, images {args.image_size}x{args.image_size}")
log(f"Number of {device}s: {hvd.size()}")

log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

log("Running benchmark...")
rates = []
for i in range(args.num_iters):
    seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    # The slowest rank sets the pace of a synchronous job.
    seconds = hvd.allreduce(torch.tensor(seconds), op=hvd.Max, name="iter_seconds").item()
    rates.append(args.batch_size * args.num_batches_per_iter / seconds)
    log(f"Iter #{i}: {rates[-1]:.1f} img/sec per {device}")

mean, conf = np.mean(rates), 1.96 * np.std(rates)
log(f"Img/sec per {device}: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
