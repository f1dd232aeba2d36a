"""ResNet-20 on CIFAR-style 3×32×32 shards, the way He et al. train it, data-parallel over MPI.

    python -m hpctrain.data_tools convert --from cifar cifar-10-batches-py --out data/cifar10
    mpiexec -n 4 python examples/resnet20_cifar.py --data data/cifar10 --epochs 160

Linear-scaling rule with warmup and cosine decay; Final Polishing of BN statistics at the end.
"""
import argparse

import torch

import hpctrain
from hpctrain.models.resnet import resnet20


def evaluate(trainer, data, topo):
    correct = count = 0
    with trainer.evaluation() as model, torch.no_grad():     # the same (rank 0's) BN statistics everywhere
        for x, y in hpctrain.shard_eval_batches(data, topo):
            correct += int((model(x).argmax(1) == y).sum())
            count += len(y)
    t = hpctrain.allreduce_metrics({"c": correct, "n": count}, topo.comm, average=False)
    return t["c"] / t["n"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=160)
    ap.add_argument("--batch-per-rank", type=int, default=32)
    ap.add_argument("--max-steps", type=int, default=0, help="stop early (smoke tests)")
    args = ap.parse_args()

    topo = hpctrain.init()
    loader = hpctrain.shard_loader(args.data, topo, batch_size=args.batch_per_rank)
    model = resnet20(num_classes=loader.shards.index.num_classes, zero_init_residual=True)
    opt = hpctrain.make_optimizer(model, "sgd", lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    schedule = hpctrain.spec_from_config(lr=0.1, global_batch=args.batch_per_rank * topo.size,
                                         steps_per_epoch=len(loader), epochs=args.epochs, warmup_epochs=1,
                                         kind="cosine", base_batch=128)
    trainer = hpctrain.DistributedTrainer(model, opt, topo, schedule=schedule)
    for epoch in range(args.epochs):
        for x, y in loader.epoch(epoch):
            trainer.step(x, y)
            if args.max_steps and trainer.step_count >= args.max_steps:
                break
        if args.max_steps and trainer.step_count >= args.max_steps:
            break
    before = evaluate(trainer, args.data, topo)
    hpctrain.recompute_bn_stats(model, loader.epoch(args.epochs), topo.comm)
    after = evaluate(trainer, args.data, topo)
    if topo.rank == 0:
        print(f"test accuracy {before:.4f} before, {after:.4f} after BN polishing")
    trainer.close()


if __name__ == "__main__":
    main()
