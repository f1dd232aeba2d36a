"""A codec's options (issue 24): its constructor's ``Option``-annotated keywords are the
``[comm.<codec>]`` sub-table, read, checked, listed and recorded as the update algorithms' and
optimisers' are, and reach the codec the trainer builds."""
import sys

import pytest
import torch
from mpi4py import MPI

from hpctrain.job.args import config_from_args
from hpctrain.job.setup import trainer_keywords
from hpctrain.config.plugins import plugin_options
from hpctrain.job.config import ConfigError, help_text, validate
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

CODEC = '''
from typing import Annotated

from hpctrain.comm.compression import COMPRESSIONS, NoCompression
from hpctrain.config.plugins import check_options
from hpctrain.config.values import Option, Range


@COMPRESSIONS.register("tagged")
class Tagged(NoCompression):
    """Full precision, with one option to show it arrives."""

    def __init__(self, *, headroom: Annotated[float, Option("share of the range kept free", Range(0, 1, lo_open=True))] = 0.5):
        check_options(Tagged, "comm.tagged", locals())
        self.headroom = headroom
'''


@pytest.fixture
def codec_module(tmp_path, monkeypatch, plugin_sandbox):
    (tmp_path / "codec_for_test.py").write_text(CODEC)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "codec_for_test", raising=False)
    yield "codec_for_test:tagged"
    sys.modules.pop("codec_for_test", None)


def from_set(items):
    return config_from_args([a for item in items for a in ("--set", item)] + ["--run-dir", "/nonexistent/run"])


def built_codec(cfg):
    model = torch.nn.Linear(3, 1)
    tr = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), Topology.create(MPI.COMM_SELF),
                            **trainer_keywords(cfg))
    try:
        return tr.grad_sync.codec
    finally:
        tr.close()


def test_codec_option_from_the_config_reaches_the_codec(codec_module):
    cfg = from_set([f"comm.compression={codec_module}", "comm.tagged.headroom=0.25"])
    validate(cfg)
    codec = built_codec(cfg)
    assert (type(codec).__name__, codec.headroom) == ("Tagged", 0.25)
    assert cfg.to_dict()["comm"]["tagged"] == {"headroom": 0.25}
    assert built_codec(from_set([f"comm.compression={codec_module}"])).headroom == 0.5     # its default
    assert "  comm.tagged.headroom = 0.5\n      share of the range kept free (must be in (0, 1])" in help_text()


def test_bad_codec_option_is_one_line(codec_module):
    with pytest.raises(ConfigError, match=r"^config comm\.tagged\.headroom: must be in \(0, 1\], got 2\.0$"):
        validate(from_set([f"comm.compression={codec_module}", "comm.tagged.headroom=2"]))
    with pytest.raises(ConfigError, match=r"^config comm\.fp16\.headroom: unknown key"):
        validate(from_set(["comm.compression=fp16", "comm.fp16.headroom=0.5"]))


def test_built_in_codecs_take_no_options():
    from hpctrain import comm
    for name in ("none", "fp16"):
        cfg = from_set([f"comm.compression={name}"])
        assert plugin_options(cfg.comm, cfg.comm.compression) == {} and set(cfg.to_dict()["comm"]) == {
            "strategy", "compression", "ranks_per_node", "bucket_mb", "overlap", "tune", "delay_ms"}
