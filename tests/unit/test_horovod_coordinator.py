"""hpctrain.horovod's agreement as pure functions (``judge``, ``Sig``), the coordinator's stall
handling against a fake communicator, and the refusals: each a one-line error naming what to do."""
import pytest
import torch

import hpctrain.horovod.torch as hvd
from hpctrain.horovod.torch import coordinator as co
from hpctrain.horovod.torch.coordinator import Sig, Verdict, judge
from hpctrain.horovod.torch.errors import UnsupportedError


def allreduce(name="x", shape=(4,), dtype="float32", op="Average"):
    return Sig("allreduce", name, dtype, shape, op)


def test_agreeing_sigs_give_the_collective_to_run():
    v = judge([allreduce()] * 3)
    assert v == Verdict(sig=allreduce())


def test_free_first_dimension_and_own_extras_are_not_compared():
    sigs = [Sig("allgather", "g", "int8", ("*", 3), extra=rows) for rows in (2, 0, 5)]
    v = judge(sigs)
    assert v.error is None and v.extras == (2, 0, 5)


@pytest.mark.parametrize("field, other, shown", [
    ("shape", (5,), "[5]"), ("dtype", "float16", "float16"), ("name", "y", "'y'"),
    ("op", "Sum", "op=Sum")])
def test_a_mismatch_is_one_line_naming_tensor_and_ranks(field, other, shown):
    odd = allreduce(**{field: other})
    v = judge([allreduce(), allreduce(), odd, allreduce()])
    assert v.sig is None and "\n" not in v.error
    assert v.error.startswith("hpctrain.horovod: ranks called different collectives (")
    assert "ranks 0,1,3: allreduce 'x' float32 [4] op=Average" in v.error
    assert "rank 2: allreduce" in v.error and shown in v.error.split("rank 2:")[1]


def test_different_kinds_and_roots_mismatch():
    v = judge([Sig("broadcast", "b", "float32", (2,), root=0), Sig("broadcast", "b", "float32", (2,), root=1)])
    assert "rank 0: broadcast 'b' float32 [2] root=0; rank 1: broadcast 'b' float32 [2] root=1" in v.error
    v = judge([Sig("barrier", "barrier"), allreduce()])
    assert "rank 0: barrier 'barrier'; rank 1: allreduce 'x'" in v.error


def test_joined_ranks_mirror_or_are_refused():
    join = Sig("join", "join")
    v = judge([allreduce(), join, allreduce()])
    assert v.error is None and v.sig == allreduce() and v.joined == (1,)
    v = judge([join, join])
    assert v == Verdict(joined=(0, 1))             # everyone joined: nothing to run
    v = judge([allreduce(), join], refuse_joined=lambda s, j: f"no {s.kind} with {j}")
    assert v.error == "hpctrain.horovod: allreduce 'x' float32 [4] op=Average while rank 1 joined: no allreduce with (1,)"


def test_describe_and_key():
    s = Sig("allgather", "g", "bfloat16", ("*", 3), extra=7)
    assert s.describe() == "allgather 'g' bfloat16 [*, 3]"
    assert s.key() == ("allgather", "g", "bfloat16", ("*", 3), "", -1)


def test_the_refusals_of_joined_ranks():
    from hpctrain.horovod.torch.mpi_ops import refuse_joined
    assert refuse_joined(allreduce(), (1,)) is None
    assert refuse_joined(Sig("broadcast", "b", root=0), (1,)) is None
    assert refuse_joined(Sig("broadcast", "b", root=1), (1,)) == "its root rank 1 has joined"
    assert "take part only in" in refuse_joined(Sig("alltoall", "a"), (1,))


class FakeComm:
    """Rank 0 of two whose partner never arrives (the test's abort raises instead of ending it)."""

    def Dup(self):
        return self

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def iprobe(self, *args):
        return False


def fake_abort(status):
    raise SystemExit(status)


def test_stall_warns_then_ends_with_one_line_naming_the_missing_rank(monkeypatch, capsys):
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "0.05")
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0.2")
    monkeypatch.setattr(co.time, "sleep", lambda s: None)
    coord = co.Coordinator(FakeComm())
    coord._abort = fake_abort
    with pytest.raises(SystemExit) as e:
        coord.agree(allreduce())
    assert e.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("hpctrain.horovod: warning: rank 1 not at allreduce 'x'")
    assert lines[1].startswith("hpctrain.horovod: rank 1 did not reach allreduce 'x' float32 [4] op=Average within ")
    assert lines[1].endswith(" s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS); ending the job")
    assert len(lines) == 2


def test_bad_stall_setting_is_one_line(monkeypatch):
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "soon")
    with pytest.raises(ValueError, match=r"^HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: expected seconds, got 'soon'$"):
        co.Coordinator(FakeComm())


def one_line(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg and msg.startswith("hpctrain.horovod: "), msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("var, word", [("HOROVOD_TIMELINE", "timeline"), ("HOROVOD_ELASTIC", "elastic"),
                                       ("HOROVOD_PROCESS_SETS", "process sets")])
def test_refused_environment_at_init(monkeypatch, var, word):
    monkeypatch.setenv(var, "/tmp/x.json" if var == "HOROVOD_TIMELINE" else "1")
    with pytest.raises(UnsupportedError) as e:
        hvd.init()
    one_line(e, var, word)
    assert not hvd.is_initialized()


@pytest.mark.parametrize("call, words", [
    (lambda: hvd.init(process_sets=[hvd.ProcessSet()]), ["process_sets", "one job per group"]),
    (lambda: hvd.init(comm=[0, 1]), ["init(comm=list)", "mpi4py communicator"]),
    (lambda: hvd.ProcessSet([0, 1]), ["ProcessSet(ranks)"]),
    (lambda: hvd.add_process_set([0]), ["add_process_set"]),
    (lambda: hvd.remove_process_set(None), ["remove_process_set"]),
    (lambda: hvd.start_timeline("/tmp/t.json"), ["start_timeline", "hpctrain's timeline"]),
    (lambda: hvd.stop_timeline(), ["stop_timeline"]),
    (lambda: hvd.elastic, ["horovod.torch.elastic", "checkpoints"]),
    (lambda: hvd.grouped_allgather, ["grouped_allgather", "per tensor"]),
    (lambda: hvd.grouped_reducescatter, ["grouped_reducescatter"]),
    (lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), ["op=Adasum", "hvd.Average"]),
    (lambda: hvd.allreduce(torch.ones(2), process_set=object()), ["process set"]),
    (lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1),
                                      op=hvd.Adasum), ["op=Adasum", "LARS"]),
    (lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1),
                                      compression=hvd.Compressor), ["compression=Compressor"]),
])
def test_refusals_are_one_line(call, words):
    with pytest.raises(UnsupportedError) as e:
        call()
    one_line(e, "not supported", *words)


def test_unsupported_dtype_and_uninitialized_are_one_line():
    from hpctrain.horovod.torch import buffers as B
    with pytest.raises(ValueError, match="^Tensor type torch.BoolTensor is not supported"):
        B.check(torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^Horovod has not been initialized; use hvd.init\(\).$"):
        hvd.rank()
