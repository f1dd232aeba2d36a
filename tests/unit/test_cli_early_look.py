"""The CLI's look at run.run_dir, ckpt.dir and train.device before MPI and torch start: read
without the schema (which imports every registry), so it must agree with the schema's reading."""
import subprocess
import sys

from hpctrain.job.args import EARLY_KEYS, config_from_args, early_look


def schema_values(argv):
    cfg = config_from_args(argv)
    return {"run.run_dir": cfg.run.run_dir, "ckpt.dir": cfg.ckpt.dir, "train.device": cfg.train.device}


def test_defaults_are_the_schemas():
    assert EARLY_KEYS == schema_values([])
    assert early_look([]) == schema_values([])


def test_file_then_set_then_flags_as_the_schema_orders_them(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[run]\nrun_dir = "from-file"\n[ckpt]\ndir = "ck-file"\n[train]\ndevice = "cpu"\n'
                 '[update.odsgd]\nwarmup_steps = 3\n')
    for argv in (["--config", str(f)],
                 ["--config", str(f), "--set", "run.run_dir=from-set", "--set", "ckpt.dir=ck-set"],
                 ["--config", str(f), "--set", "run.run_dir=from-set", "--run-dir", "from-flag"]):
        assert early_look(argv) == schema_values(argv), argv


def test_unparsable_arguments_and_help_give_none(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    assert early_look(["--config", str(bad)]) is None
    assert early_look(["--no-such-flag"]) is None and early_look(["--help"]) is None


def test_values_the_schema_refuses_give_none_not_a_default(tmp_path):
    """Never a run directory the user did not give: a non-string value or a --set without '='
    is left to the schema, which names the field."""
    f = tmp_path / "run.toml"
    f.write_text("[run]\nrun_dir = 5\n")
    assert early_look(["--config", str(f)]) is None
    assert early_look(["--set", "run.run_dir"]) is None
    assert early_look(["--set", "train.epochs=3"]) == dict(EARLY_KEYS)


def test_the_early_look_imports_neither_torch_nor_mpi():
    code = ("import sys; from hpctrain.job.args import early_look; early_look(['--set', 'update.algorithm=odsgd']); "
            "print(sorted(m for m in ('torch', 'mpi4py.MPI') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
