"""``bench step``'s compiled row: ``+compile`` parses beside the other flags, is in the default
contenders, and builds a trainer whose model is compiled in place (one rank, COMM_SELF). The
timing itself is for a quiet machine (docs/getting-started.md)."""
import torch
from mpi4py import MPI

from hpctrain.job.config import CommConfig
from hpctrain.tools.bench import step as bench
from hpctrain.topology import Topology


def test_compile_flag_parses_beside_the_others():
    d = CommConfig()
    assert bench.parse_config("default+compile") == {
        "strategy": d.strategy, "compression": d.compression, "overlap": d.overlap, "bucket_mb": d.bucket_mb,
        "compile": True}
    assert bench.parse_config("flat+fp16+compile")["compression"] == "fp16"
    assert "default+compile" in bench.parse_args([]).configs


def test_the_compiled_contender_trains_its_own_model_compiled_in_place():
    topo = Topology.create(MPI.COMM_SELF)
    torch.manual_seed(0)
    base = bench.make_model("digits_cnn")
    c = bench.build("default+compile", base, topo, None)
    try:
        assert c.model is not base and c.model._compiled_call_impl is not None     # nn.Module.compile's
        assert list(c.model.state_dict()) == list(base.state_dict())
        plain = bench.build("default", base, topo, None)
        assert plain.model._compiled_call_impl is None
        plain.close()
    finally:
        c.close()
        topo.close()
