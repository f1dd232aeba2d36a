"""Train a small CNN on scikit-learn's handwritten digits, written as a Horovod user writes it.

    mpiexec -n 2 python examples/horovod/pytorch_digits.py --epochs 10

Every Horovod habit is here: the data partitioned by ``DistributedSampler``, the learning rate
scaled by the number of ranks, rank 0's weights and optimizer state broadcast before training,
``DistributedOptimizer`` averaging gradients (optionally over several local batches, or in fp16),
and the test metrics averaged over ranks with ``hvd.allreduce``. The data ship with scikit-learn
(1797 8x8 images), so nothing is downloaded.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hpctrain.horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch digits example",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
parser.add_argument("--test-batch-size", type=int, default=256)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank")
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--batches-per-allreduce", type=int, default=1,
                    help="local batches accumulated before gradients are averaged")
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression in allreduce")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=10, help="batches between log lines")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def datasets(seed):
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed,
                                                        stratify=y)
    return (torch.utils.data.TensorDataset(x_train, y_train),
            torch.utils.data.TensorDataset(x_test, y_test))


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)              # a different shuffle every epoch, alike on all ranks
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        # Split the batch into sub-batches whose gradients add up locally before the allreduce.
        chunks = list(zip(data.split(args.batch_size), target.split(args.batch_size)))
        for data_chunk, target_chunk in chunks:
            loss = F.nll_loss(model(data_chunk), target_chunk) / len(chunks)
            loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print(f"Train epoch {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                  f"\tloss {loss.item() * len(chunks):.4f}")


def test():
    model.eval()
    loss, correct = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(1).eq(target).sum().item()
    # Each rank saw its own part of the test set; average the per-rank means.
    loss = metric_average(loss / len(test_sampler), "avg_loss")
    accuracy = metric_average(correct / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"Test set: average loss {loss:.4f}, accuracy {100 * accuracy:.2f}%", flush=True)
    return accuracy


if __name__ == "__main__":
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)                    # one core per rank

    train_dataset, test_dataset = datasets(args.seed)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size * args.batches_per_allreduce, sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net()
    # Gradients are averaged over hvd.size() * batches_per_allreduce batches: scale the rate too.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size() * args.batches_per_allreduce,
                          momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=args.batches_per_allreduce)
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test()
        scheduler.step()
