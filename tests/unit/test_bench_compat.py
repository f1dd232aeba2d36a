"""The compat benchmark's parts that need no MPI: paired ratios across jobs, the table, arguments."""
import pytest

from hpctrain.tools.bench import compat as bench


def test_ratios_are_medians_of_per_round_ratios_to_each_peer():
    # seconds per step of 8 images; round 2 is slow for everyone, round 3 only for Horovod
    rounds = [{"mlp": {bench.OURS: 1.0, bench.TRAINER: 1.0, bench.HOROVOD: 2.0}},
              {"mlp": {bench.OURS: 2.0, bench.TRAINER: 2.2, bench.HOROVOD: 4.0}},
              {"mlp": {bench.OURS: 1.0, bench.TRAINER: 0.9, bench.HOROVOD: 8.0}}]
    rows = {r["contender"]: r for r in bench.rows_from_rounds(rounds, 8)}
    ours = rows[bench.OURS]
    assert ours["images_per_s"] == pytest.approx(8.0)                      # median of 8, 4, 8
    assert ours["x_trainer"] == pytest.approx(1.0)                          # median of 1, 1.1, 0.9
    assert ours["x_horovod"] == pytest.approx(2.0)                          # median of 2, 2, 8
    assert rows[bench.HOROVOD]["x_horovod"] == pytest.approx(1.0)


def test_without_horovod_its_column_is_empty():
    rows = bench.rows_from_rounds([{"resnet18": {bench.OURS: 0.5, bench.TRAINER: 0.5}}], 16)
    lines = bench.format_table(rows).splitlines()
    assert len(lines) == 4
    assert lines[2].split() == ["resnet18", "hpctrain.horovod", "32.0", "1.000", "-"]


def test_arguments():
    args = bench.parse_args(["--models", "mlp,resnet50", "--fp16"])
    assert args.models == ["mlp", "resnet50"] and args.fp16 and args.worker is None
    with pytest.raises(SystemExit):
        bench.parse_args(["--models", "vgg16"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])
