"""The one difference between ranks that is not a mismatch: a named ``allreduce_async`` on some
ranks while the rest call ``barrier`` (Horovod leaves the allreduce pending and runs the barrier).
``judge`` parks exactly those ranks; every neighbouring case stays the mismatch it was."""
import pytest

from hpctrain.horovod.coordinator import Sig, judge

BARRIER = Sig("barrier", "barrier")


def named_async(name="duplicate_name"):
    return Sig("allreduce", name, "float32", (17, 17, 17), "Average", parkable=True)


def test_a_named_async_call_against_barriers_is_parked_on_its_ranks():
    v = judge([named_async(), BARRIER, BARRIER])
    assert v.parked == (0,) and v.error is None
    assert judge([BARRIER, named_async(), named_async()]).parked == (1, 2)


@pytest.mark.parametrize("sigs", [
    [named_async()._replace(parkable=False), BARRIER],                 # a blocking allreduce
    [named_async(), Sig("allreduce", "other", "float32", (4,), "Average")],   # not a barrier
    [named_async(), named_async("other")],                              # two names: no barrier either
    [named_async(), BARRIER, Sig("allgather", "g", "float32", ("*", 2))],     # a third kind
])
def test_every_other_difference_stays_a_mismatch(sigs):
    v = judge(sigs)
    assert not v.parked and v.error and "ranks called different collectives" in v.error


def test_parkable_does_not_change_what_is_compared():
    v = judge([named_async(), named_async()._replace(parkable=False)])
    assert v.error is None and not v.parked and v.sig.name == "duplicate_name"
