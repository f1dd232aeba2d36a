"""hpctrain.horovod's agreement as pure functions (``judge``, ``Sig``), the coordinator's stall
handling against a fake communicator, and the refusals: each a one-line error naming what to do."""
import pytest
import torch

import hpctrain.horovod.torch as hvd
from hpctrain.horovod import coordinator as co
from hpctrain.horovod.coordinator import Sig, Verdict, judge
from hpctrain.horovod.errors import UnsupportedError


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
    """As in Horovod: only reductions, barriers and optimizer steps run while a rank has joined."""
    from hpctrain.horovod.torch.basics import refuse_joined
    assert refuse_joined(allreduce(), (1,)) is None
    assert refuse_joined(Sig("grad", "optimizer.0.0"), (1,)) is None
    for kind in ("allgather", "broadcast", "alltoall", "reducescatter", "broadcast_object"):
        assert "only allreduce" in refuse_joined(Sig(kind, "a", root=0), (1,))


def test_a_problem_with_one_ranks_arguments_is_an_argument_error_for_all():
    ok = Sig("broadcast", "b", "float32", (2,), root=5)
    bad = ok._replace(problem="root_rank 5 is not a rank of this job")
    v = judge([ok, bad, bad])
    assert v.error_kind == "argument" and v.sig is None
    assert v.error == ("hpctrain.horovod: broadcast 'b' float32 [2] root=5: root_rank 5 is not a rank "
                       "of this job (on ranks 1,2)")


def test_an_argument_problem_wins_over_calls_that_also_differ():
    """A 0-d tensor on one rank also makes its shape differ: the problem is the error reported."""
    ok = Sig("reducescatter", "r", "float32", (2,), op="Sum")
    bad = Sig("reducescatter", "r", "float32", (), op="Sum", problem="needs a tensor of at least one dimension")
    v = judge([ok, ok, bad])
    assert v.error_kind == "argument" and "(on rank 2)" in v.error and "different" not in v.error


def test_agree_raises_the_verdict_on_the_caller():
    from hpctrain.horovod.errors import CollectiveArgumentError
    coord = co.Coordinator.__new__(co.Coordinator)
    coord.size, coord.rank, coord.n_agreed, coord.refuse_joined = 1, 0, 0, lambda s, j: None
    with pytest.raises(CollectiveArgumentError) as e:
        coord.agree(Sig("alltoall", "a", problem="splits [3] must be 1 non-negative counts"))
    assert isinstance(e.value, ValueError) and e.value.defer_s == 0.0
    assert coord.agree(allreduce()).sig == allreduce()


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


def test_no_horovod_variable_stops_init(monkeypatch, tmp_path, capsys):
    """Horovod's variables are used (the timeline) or named in one line as not used."""
    path = tmp_path / "timeline.json"
    for var, value in [("HOROVOD_TIMELINE", str(path)), ("HOROVOD_ELASTIC", "1"),
                       ("HOROVOD_CYCLE_TIME", "5"), ("HOROVOD_GPU_OPERATIONS", "NCCL")]:
        monkeypatch.setenv(var, value)
    hvd.init()
    try:
        hvd.allreduce(torch.ones(3), name="test_allreduce")
    finally:
        hvd.shutdown()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("hpctrain.horovod: not used: HOROVOD_CYCLE_TIME ("), err
    assert "HOROVOD_ELASTIC (" in err[0] and "HOROVOD_GPU_OPERATIONS" in err[0] and "TIMELINE" not in err[0]
    import json
    trace = json.loads(path.read_text())
    names = [e["name"] for e in trace["traceEvents"]]
    assert "NEGOTIATE_ALLREDUCE allreduce.test_allreduce" in names
    assert "ALLREDUCE allreduce.test_allreduce" in names
    assert trace["otherData"]["start_time_since_epoch_in_micros"] > 0


def test_dynamic_timeline_records_between_start_and_stop(monkeypatch, tmp_path):
    monkeypatch.setenv("HOROVOD_TIMELINE", "DYNAMIC")
    hvd.init()
    try:
        hvd.allreduce(torch.ones(1), name="before")
        hvd.start_timeline(tmp_path / "t.json", mark_cycles=True)
        hvd.allreduce(torch.ones(1), name="during")
        hvd.stop_timeline()
        hvd.allreduce(torch.ones(1), name="after")
    finally:
        hvd.shutdown()
    text = (tmp_path / "t.json").read_text()
    assert "allreduce.during" in text and "CYCLE_START" in text
    assert "allreduce.before" not in text and "allreduce.after" not in text


@pytest.mark.parametrize("call, words", [
    (lambda: hvd.elastic, ["horovod.torch.elastic", "checkpoints"]),
    (lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), ["op=Adasum", "hvd.Average"]),
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
    from hpctrain.horovod.torch import collectives as C
    with pytest.raises(ValueError, match="^Tensor type torch.BoolTensor is not supported"):
        C.check(torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^Horovod has not been initialized; use hvd.init\(\).$"):
        hvd.rank()
