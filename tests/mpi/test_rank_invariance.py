"""The same run at any rank count, in MPI: with data.lanes fixed, augmentation on and
model.bn_group set, the first 20 steps' global losses at this rank count equal one process's
(computed here, with the global batch, plain torch) to 1e-5, in float64 (in float32 the
reassociated gradient sums alone make the losses drift apart by ~1e-3 within 20 steps:
docs/data.md); and a run stopped here and resumed on half the ranks (a sub-communicator: the
real Checkpointer and trainer, no launch) continues the same leg with the same samples and
losses. Run at -n 1, 2 and 4."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI

from hpctrain.data import ShardLoader, ShardSet, read_index
from hpctrain.data.augment import Augment
from hpctrain.models.ghostbn import use_bn_groups
from hpctrain.models.small import SmallCNN
from hpctrain.ops.checkpoint import Checkpointer
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

GLOBAL, LANES, GROUP, STEPS, LR = 32, 4, 4, 20, 0.05


def loader(d, rank, size):
    return ShardLoader(ShardSet(read_index(d), "train"), rank=rank, size=size, batch_size=GLOBAL // size, seed=3,
                       block_size=8, shuffle_window=32, prefetch=0, lanes=LANES,
                       transform=Augment("padcrop", flip=True, pad=1))


def model():
    torch.manual_seed(11)
    m = SmallCNN(num_classes=10, in_channels=1).double()      # float64: reassociation stays ~1e-15, not 1e-4
    use_bn_groups(m, GROUP)
    return m


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9)


def batches(ld, start, count):
    """``count`` batches of ``ld`` from global step ``start`` on (epoch by epoch)."""
    out, step = [], start
    while len(out) < count:
        epoch, skip = divmod(step, ld.steps)
        for x, y in ld.epoch(epoch, skip=skip):
            out.append((x.double(), y))
            step += 1
            if len(out) == count:
                break
    return out


@pytest.fixture(scope="module")
def reference(digits_dir):
    """One process, the global batch, plain torch: the losses of steps 0..2·STEPS (rank 0 computes,
    the others receive them)."""
    losses = []
    if MPI.COMM_WORLD.Get_rank() == 0:
        m = model()
        opt = sgd(m)
        for x, y in batches(loader(digits_dir, 0, 1), 0, 2 * STEPS):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
    return MPI.COMM_WORLD.bcast(losses, root=0)


class _Freed:
    """A communicator that ``closer`` frees in teardown."""
    def __init__(self, comm):
        self.comm = comm

    def close(self):
        self.comm.Free()


def global_loss(result, comm):
    return comm.allreduce(float(result.loss), op=MPI.SUM) / comm.Get_size()


def train(trainer, ld, start, count, comm):
    return [global_loss(trainer.step(x, y), comm) for x, y in batches(ld, start, count)]


@pytest.mark.mpi
def test_first_20_steps_match_one_process_with_augmentation_and_bn_groups(digits_dir, reference, closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if LANES % size:
        pytest.skip(f"{LANES} lanes need a rank count dividing them")
    topo = closer(Topology.create(comm))
    m = model()
    trainer = closer(DistributedTrainer(m, sgd(m), topo))
    got = train(trainer, loader(digits_dir, rank, size), 0, STEPS, comm)
    diff = np.abs(np.array(got) - np.array(reference[:STEPS]))
    assert diff.max() < 1e-5, (size, diff.max(), got[:3], reference[:3])
    assert reference[STEPS - 1] < reference[0] - 0.3                     # it trained


@pytest.mark.mpi
def test_stopped_here_resumed_on_half_the_ranks_continues_the_same_run(digits_dir, reference, closer, tmp_path):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2 or LANES % size:
        pytest.skip("needs 2 or 4 ranks")
    directory = comm.bcast(str(tmp_path), root=0)
    topo = closer(Topology.create(comm))
    m = model()
    trainer = closer(DistributedTrainer(m, sgd(m), topo))
    ld = loader(digits_dir, rank, size)
    train(trainer, ld, 0, STEPS, comm)
    Checkpointer(comm, directory, steps_per_epoch=ld.steps, global_batch=GLOBAL, config={},
                 lanes=ld.lanes).save(trainer)
    comm.Barrier()
    half = size // 2
    sub = comm.Split(0 if rank < half else MPI.UNDEFINED, rank)
    if sub == MPI.COMM_NULL:
        return
    closer(_Freed(sub))
    sub_topo = closer(Topology.create(sub))
    torch.manual_seed(99)
    m2 = SmallCNN(num_classes=10, in_channels=1).double()      # other weights: the checkpoint must set them
    use_bn_groups(m2, GROUP)
    resumed = closer(DistributedTrainer(m2, sgd(m2), sub_topo))
    ld2 = loader(digits_dir, rank, half)
    ckpt = Checkpointer(sub, directory, steps_per_epoch=ld2.steps, global_batch=GLOBAL, config={}, lanes=ld2.lanes)
    pos = ckpt.resume(resumed, "auto")
    assert pos is not None and pos.step == STEPS and ckpt.leg == 0           # the same leg, the same step
    one = loader(digits_dir, 0, 1)
    epoch, skip = divmod(STEPS, one.steps)
    ids_one = [one.window_ids(0)[idx].copy() for _, _, idx in one.window_batches(epoch, skip)][:STEPS]
    ids_here = [ld2.window_ids(rank)[idx].copy() for _, _, idx in ld2.window_batches(epoch, skip)][:STEPS]
    b = GLOBAL // half
    for k, (a, mine) in enumerate(zip(ids_one, ids_here)):
        assert np.array_equal(a[rank * b:(rank + 1) * b], mine), k                # same samples after the resume
    got = train(resumed, ld2, STEPS, STEPS, sub)
    diff = np.abs(np.array(got) - np.array(reference[STEPS:2 * STEPS]))
    assert diff.max() < 1e-5, (size, half, diff.max())
