"""hpctrain.horovod's training path: a Horovod-style loop equals hpctrain's DistributedTrainer
with the same settings and one process training on the global batch with torch's optimiser;
``broadcast_optimizer_state`` carries every torch.optim optimizer's options and state exactly;
``SyncBatchNorm`` equals torch's BatchNorm on the global batch."""
import warnings

import pytest
import torch
from mpi4py import MPI

import hpctrain.horovod.torch as hvd
from tests.mpi.horovod_session import hvd_on, world  # noqa: F401  (hvd_on: autouse fixture)
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

pytestmark = pytest.mark.mpi
STEPS, PER_RANK = 3, 4


def make_model(seed, dtype):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(dtype)


def global_batches(size, dtype, steps=STEPS):
    g = torch.Generator().manual_seed(99)
    return [(torch.randn(size * PER_RANK, 6, generator=g, dtype=dtype),
             torch.randint(0, 3, (size * PER_RANK,), generator=g)) for _ in range(steps)]


def shard(batch, r):
    x, y = batch
    return x[r * PER_RANK:(r + 1) * PER_RANK], y[r * PER_RANK:(r + 1) * PER_RANK]


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def loss_fn(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def horovod_loop(dtype, passes=1, explicit_sync=False, **options):
    """What a Horovod script does: different inits made equal by broadcast_parameters, each rank
    its shard of every global batch (split in ``passes`` backward passes)."""
    rank, size = world()
    model = make_model(rank, dtype)                   # rank 0's init is the reference's
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **options)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    try:
        for x, y in global_batches(size, dtype):
            opt.zero_grad()
            xs, ys = x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]
            for xp, yp in zip(xs.chunk(passes), ys.chunk(passes)):
                loss_fn(model, xp, yp).backward()
            if explicit_sync:
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
    finally:
        opt.close()
    return model


def one_process(dtype, loss_scale=1.0, clip=None):
    """torch alone on the global batch (``loss_scale``: what op=Sum / accumulation multiply)."""
    model = make_model(0, dtype)
    opt = sgd(model)
    for p in model.parameters():          # Horovod's broadcast_optimizer_state on a fresh
        p.grad = torch.zeros_like(p)      # optimizer: one step with zero gradients first
    opt.step()
    for x, y in global_batches(world()[1], dtype):
        opt.zero_grad()
        (loss_fn(model, x, y) * loss_scale).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return model


def trainer_loop(dtype, closer, compression="none"):
    rank, size = world()
    model = make_model(0, dtype)
    topo = closer(Topology.create(MPI.COMM_WORLD))
    opt = sgd(model)
    for p in model.parameters():          # what broadcast_optimizer_state did to the Horovod loop
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad()
    trainer = closer(DistributedTrainer(model, opt, topo, compression=compression))
    for x, y in global_batches(size, dtype):
        trainer.step(x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK])
    return model


def max_diff(a, b):
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


CASES = {   # name: (DistributedOptimizer options, passes, explicit sync, one-process loss scale)
    "average": ({}, 1, False, 1.0),
    "sum": ({"op": hvd.Sum}, 1, False, None),                   # None: the number of ranks
    "two_backward_passes": ({}, 2, False, 2.0),
    "gradient_predivide_factor": ({"gradient_predivide_factor": 2.0}, 1, False, 1.0),
    "synchronize_then_skip": ({}, 1, True, 1.0),
}


@pytest.mark.parametrize("case", CASES)
def test_horovod_loop_equals_trainer_and_one_process(case, closer):
    options, passes, explicit, scale = CASES[case]
    size = world()[1]
    hvd_model = horovod_loop(torch.float64, passes, explicit, **options)
    ref = one_process(torch.float64, size if scale is None else scale, clip=0.05 if explicit else None)
    assert max_diff(ref, make_model(0, torch.float64)) > 1e-3                  # it trained
    assert max_diff(hvd_model, ref) <= 1e-12, case
    if options in ({}, {"gradient_predivide_factor": 2.0}) and passes == 1 and not explicit:
        assert max_diff(hvd_model, trainer_loop(torch.float64, closer)) <= 1e-14
    sums = MPI.COMM_WORLD.allgather([p.detach().sum().item() for p in hvd_model.parameters()])
    assert all(s == sums[0] for s in sums)                                       # replicas agree


def test_compression_fp16_equals_trainers_fp16_wire(closer):
    hvd_model = horovod_loop(torch.float32, compression=hvd.Compression.fp16)
    assert max_diff(hvd_model, trainer_loop(torch.float32, closer, compression="fp16")) <= 1e-6
    assert max_diff(hvd_model, one_process(torch.float32)) <= 2e-3               # fp16 rounding


def test_step_after_synchronize_warns_and_extra_backward_is_refused():
    rank, size = world()
    model = make_model(0, torch.float64)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    try:
        x, y = global_batches(size, torch.float64)[0]
        loss_fn(model, x, y).backward()
        opt.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        assert any("skip_synchronize" in str(w.message) for w in caught)
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        with pytest.raises(AssertionError, match="backward_passes_per_step"):
            loss_fn(model, x, y).backward()
        opt.synchronize()
    finally:
        opt.close()


def test_join_with_uneven_batches_averages_over_every_rank():
    """Rank r has r + 1 batches; a joined rank adds zero gradients to the others' steps and the
    average still divides by every rank (Horovod's join). Reference: the same sums made locally
    from every active rank's shard, step by step; rank r compares after its own last step."""
    rank, size = world()
    batches = global_batches(size, torch.float64, steps=size)
    model = make_model(0, torch.float64)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    try:
        for step in range(rank + 1):
            opt.zero_grad()
            loss_fn(model, *shard(batches[step], rank)).backward()
            opt.step()
        assert hvd.join() == size - 1
    finally:
        opt.close()
    ref = make_model(0, torch.float64)
    ref_opt = sgd(ref)
    for step in range(rank + 1):
        ref_opt.zero_grad()
        (sum(loss_fn(ref, *shard(batches[step], r)) for r in range(step, size)) / size).backward()
        ref_opt.step()
    assert max_diff(ref, make_model(0, torch.float64)) > 1e-3
    assert max_diff(model, ref) <= 1e-12


# --- broadcast_optimizer_state -----------------------------------------------------------------
OPTIMIZERS = {
    "SGD": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "Adam": lambda p, lr: torch.optim.Adam(p, lr=lr, betas=(0.8, 0.99), amsgrad=True),
    "AdamW": lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.05),
    "Adagrad": lambda p, lr: torch.optim.Adagrad(p, lr=lr, lr_decay=0.01, initial_accumulator_value=0.1),
    "Adadelta": lambda p, lr: torch.optim.Adadelta(p, lr=lr, rho=0.8),
    "Adamax": lambda p, lr: torch.optim.Adamax(p, lr=lr),
    "ASGD": lambda p, lr: torch.optim.ASGD(p, lr=lr, t0=1),
    "NAdam": lambda p, lr: torch.optim.NAdam(p, lr=lr, momentum_decay=0.005),
    "RAdam": lambda p, lr: torch.optim.RAdam(p, lr=lr, decoupled_weight_decay=True, weight_decay=0.1),
    "RMSprop": lambda p, lr: torch.optim.RMSprop(p, lr=lr, momentum=0.5, centered=True),
    "Rprop": lambda p, lr: torch.optim.Rprop(p, lr=lr, etas=(0.4, 1.3)),
    "SparseAdam": lambda p, lr: torch.optim.SparseAdam(p, lr=lr),
    "LBFGS": lambda p, lr: torch.optim.LBFGS(p, lr=lr, max_iter=3, history_size=2),
    "Adafactor": lambda p, lr: torch.optim.Adafactor(p, lr=lr, beta2_decay=-0.7),
    "Muon": lambda p, lr: torch.optim.Muon(p, lr=lr, momentum=0.9),       # matrices only
}


def test_every_torch_optimizer_is_covered():
    import inspect
    found = {n for n, c in vars(torch.optim).items()
             if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}
    assert found <= set(OPTIMIZERS), f"add to OPTIMIZERS: {sorted(found - set(OPTIMIZERS))}"


def same(a, b) -> bool:
    """Exact equality of state dicts: tensors by dtype, shape and bits; containers recursively."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_broadcast_optimizer_state_round_trips_options_and_state(name):
    """Rank 0 trains two steps with lr 0.1, the others are fresh with other learning rates; after
    the broadcast every rank's state_dict is rank 0's, bit for bit."""
    rank, size = world()
    if not hasattr(torch.optim, name):
        pytest.skip(f"torch {torch.__version__} has no torch.optim.{name}")
    torch.manual_seed(5)
    sparse = name == "SparseAdam"
    model = torch.nn.Embedding(7, 3, sparse=True) if sparse else torch.nn.Linear(4, 3, bias=name != "Muon")
    opt = OPTIMIZERS[name](list(model.parameters()), 0.1 if rank == 0 else 0.01 * (rank + 1))

    def closure():
        opt.zero_grad()
        out = model(torch.tensor([1, 3, 3])) if sparse else model(torch.linspace(-1, 1, 8).reshape(2, 4))
        loss = out.pow(2).sum()
        loss.backward()
        return loss
    if name == "LBFGS":                   # as Horovod: refused on every rank, the job goes on
        with pytest.raises(ValueError, match="LBFGS"):
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        return
    if rank == 0:
        for _ in range(2):
            closure()
            opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    mine = opt.state_dict()
    if rank == 0:
        assert mine["state"], "rank 0 has state to send"
    states = hvd.allgather_object(mine)
    assert all(same(s, states[0]) for s in states), name
    assert same(mine, states[0]) and opt.param_groups[0]["lr"] == 0.1


def test_broadcast_optimizer_state_through_distributed_optimizer():
    rank, size = world()
    model = make_model(0, torch.float64)
    inner = torch.optim.Adam(model.parameters(), lr=0.1 if rank == 0 else 0.5)
    if rank == 0:
        loss_fn(model, *global_batches(1, torch.float64)[0]).backward()
        inner.step()
        inner.zero_grad()
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    try:
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        states = hvd.allgather_object(opt.state_dict())
        assert all(same(s, states[0]) for s in states) and len(states[0]["state"]) == 4
    finally:
        opt.close()


def test_broadcast_optimizer_state_after_a_backward_pass_keeps_the_weights_identical():
    """Each rank ran its own backward pass before the fresh optimizer's state is created: as in
    Horovod, the creating step uses zero gradients (left zero afterwards), so no rank moves its
    weights by its own gradient; a frozen parameter keeps ``grad=None``."""
    rank, size = world()
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 3)
    model.bias.requires_grad_(False)
    before = model.weight.detach().clone()
    model(torch.full((2, 4), rank + 1.0)).pow(2).sum().backward()
    assert model.weight.grad.abs().sum() > 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    weights = hvd.allgather_object(model.weight.detach())
    assert all(torch.equal(w, before) for w in weights), "a rank stepped with its own gradient"
    assert torch.equal(model.weight.grad, torch.zeros_like(model.weight)) and model.bias.grad is None


# --- SyncBatchNorm -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)], ids=str)
@pytest.mark.parametrize("shape, bn", [((3,), torch.nn.BatchNorm1d), ((3, 5), torch.nn.BatchNorm1d),
                                       ((3, 2, 4), torch.nn.BatchNorm2d)], ids=["NC", "NCL", "NCHW"])
def test_sync_batch_norm_equals_batch_norm_on_the_global_batch(shape, bn, dtype, tol):
    rank, size = world()
    g = torch.Generator().manual_seed(3)
    per = 3 + rank % 2                                    # uneven shards: counts are summed too
    sizes = [3 + r % 2 for r in range(size)]
    x = torch.randn(sum(sizes), *shape, generator=g, dtype=dtype) * 2 + 1
    w = torch.randn(x.shape, generator=g, dtype=dtype)
    start = sum(sizes[:rank])
    sl = slice(start, start + per)

    ref = bn(shape[0]).to(dtype)
    sync = hvd.SyncBatchNorm(shape[0]).to(dtype)
    with torch.no_grad():
        for m in (ref, sync):
            m.weight.copy_(torch.linspace(0.5, 1.5, shape[0]))
            m.bias.copy_(torch.linspace(-1, 1, shape[0]))
    for _ in range(2):                                    # twice: running statistics follow
        xg = x.clone().requires_grad_()
        (ref(xg) * w).sum().backward()
        xr = x[sl].clone().requires_grad_()
        y = sync(xr)
        (y * w[sl]).sum().backward()
        with torch.no_grad():
            assert (y - _train_out(ref, x)[sl]).abs().max() <= tol * 10
        assert (xr.grad - xg.grad[sl]).abs().max() <= tol * 10
    for name in ("running_mean", "running_var"):
        assert (getattr(sync, name) - getattr(ref, name)).abs().max() <= tol, name
    assert sync.num_batches_tracked == ref.num_batches_tracked
    for name in ("weight", "bias"):                       # local parts sum to the global gradient
        local = getattr(sync, name).grad.double().numpy().copy()
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, local)
        assert abs(local - getattr(ref, name).grad.double().numpy()).max() <= tol * 100, name
    sync.eval()
    ref.eval()
    with torch.no_grad():
        assert (sync(x[sl]) - ref(x)[sl]).abs().max() <= tol * 10


def _train_out(module, x):
    """``module``'s training-mode output on ``x`` without touching its running statistics."""
    return torch.nn.functional.batch_norm(x, None, None, module.weight, module.bias, True, 0.0, module.eps)
