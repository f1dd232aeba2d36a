"""The step benchmark's parts that need no MPI: contender names, the MLP, paired ratios, the table."""
import pytest

from hpctrain.tools.bench import step as bench
from hpctrain.job.config import CommConfig


def test_config_names():
    d = CommConfig()
    assert bench.parse_config("default") == {"strategy": d.strategy, "compression": d.compression,
                                             "overlap": d.overlap, "bucket_mb": d.bucket_mb}
    assert bench.parse_config("hierarchical+fp16+overlap") == {
        "strategy": "hierarchical", "compression": "fp16", "overlap": True, "bucket_mb": d.bucket_mb}
    with pytest.raises(ValueError, match="unknown flag"):
        bench.parse_config("flat+bf16")


def test_mlp_is_the_communication_heavy_model():
    n = sum(p.numel() for p in bench.make_model("mlp").parameters())
    assert 12.5e6 < n < 12.8e6


def test_paired_ratios_are_medians_of_per_round_ratios():
    assert bench.paired_ratios([1.0, 2.0, 3.0], [0.5, 2.0, 1.0]) == pytest.approx(2.0)


def test_table_and_arguments():
    rows = [{"model": "mlp", "n_params": 12.7e6, "config": c, "describe": d, "step_ms": ms, "x_ddp": x}
            for c, d, ms, x in (("ddp", "ddp", 100.0, 1.0), ("default", "flat (auto: one rank per node), x", 50.0, 2.0))]
    lines = bench.format_table(rows).splitlines()
    assert len(lines) == 4 and lines[3].split()[2:5] == ["default", "50.0", "2.00"]
    assert lines[3].endswith("flat (auto: one rank per node)")
    with pytest.raises(SystemExit):
        bench.parse_args(["--models", "vgg"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--configs", "flat+zip"])


def test_models_and_data_go_to_the_device():
    """issue 34, N3: the bench's models and data live on the chosen device (``meta`` stands in
    for a GPU here); before, they stayed on the CPU whatever the node had."""
    import torch
    meta = torch.device("meta")
    x, y = bench.make_data("digits_cnn", 4, 0, meta)
    assert x.device == meta and y.device == meta and tuple(x.shape) == (4, 1, 8, 8)
    cx, _ = bench.make_data("digits_cnn", 4, 0)
    assert cx.device.type == "cpu" and torch.equal(cx, bench.make_data("digits_cnn", 4, 0)[0])
    c = bench.build("nocomm", bench.make_model("digits_cnn"), None, None, meta)
    assert all(p.device == meta for p in c.model.parameters())
    assert bench.parse_args([]).device == "auto" and bench.parse_args(["--device", "cuda"]).device == "cuda"
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "tpu"])
