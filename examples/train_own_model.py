"""Train your own model on your own data with hpctrain: hierarchical FP16 sync and LARS.

    python -m hpctrain.data_tools convert --from npz my_data.npz --out data/mine
    mpiexec -n 4 python examples/train_own_model.py --data data/mine --ranks-per-node 2

What changes against Horovod: `hvd.init()` → `hpctrain.init()`, `hvd.DistributedOptimizer(opt)` +
`hvd.broadcast_parameters(...)` → `hpctrain.DistributedTrainer(model, opt, topo, ...)`, and the
DistributedSampler → `hpctrain.shard_loader(...)` (contiguous reads of HDF5 shards).
"""
import argparse

import torch

import hpctrain


class MyNet(torch.nn.Module):
    """Whatever model you have; here an MLP over flattened inputs."""

    def __init__(self, n_in, n_classes):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(n_in, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, n_classes))

    def forward(self, x):
        return self.net(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-per-rank", type=int, default=16)
    ap.add_argument("--ranks-per-node", type=int, default=0)
    args = ap.parse_args()

    topo = hpctrain.init(ranks_per_node=args.ranks_per_node)
    loader = hpctrain.shard_loader(args.data, topo, batch_size=args.batch_per_rank)
    index = loader.shards.index
    n_in = 1
    for d in index.sample_shape:
        n_in *= d
    model = MyNet(n_in, index.num_classes)
    opt = hpctrain.LARS(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, eta=0.02)
    global_batch = args.batch_per_rank * topo.size
    schedule = hpctrain.spec_from_config(lr=1.0, global_batch=global_batch, steps_per_epoch=len(loader),
                                         epochs=args.epochs, warmup_epochs=1, kind="poly", optimizer="lars")
    trainer = hpctrain.DistributedTrainer(model, opt, topo, strategy="hierarchical", compression="fp16",
                                          schedule=schedule)
    for epoch in range(args.epochs):
        for x, y in loader.epoch(epoch):
            loss = trainer.step(x, y).loss
        mean_loss = hpctrain.allreduce_metrics({"loss": float(loss)}, topo.comm)["loss"]
        if topo.rank == 0:
            print(f"epoch {epoch}: loss {mean_loss:.4f}")
    correct = count = 0
    with trainer.evaluation(), torch.no_grad():           # every rank scores rank 0's BN statistics
        for x, y in hpctrain.shard_eval_batches(args.data, topo):
            correct += int((model(x).argmax(1) == y).sum())
            count += len(y)
    totals = hpctrain.allreduce_metrics({"correct": correct, "count": count}, topo.comm, average=False)
    if topo.rank == 0:
        print(f"test accuracy {totals['correct'] / totals['count']:.4f}")
    trainer.close()


if __name__ == "__main__":
    main()
