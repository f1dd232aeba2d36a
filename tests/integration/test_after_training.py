"""After training: export, load_model, evaluate and TensorBoard, all looking at ONE finished run
(2 ranks, 2 epochs of digits, Final Polishing, an evaluation per epoch, TensorBoard on, a
checkpoint every 22 steps). Each figure is checked against an independent computation: plain
torch over the test split read in this process, the run's own metrics.jsonl, tensorboard's own
reader. The launches are the training run and evaluate at 2 ranks (what is tested there);
everything else calls the CLI's entry in this process."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from hpctrain.cli import main as cli_main
from hpctrain.data import ShardSet, read_index
from hpctrain.ops.checkpoint import checkpoint_name, decode, read_file
from tests.integration.mpirun import mpirun

STEPS_PER_EPOCH = 22          # 1438 digits training samples / 64


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("trained")
    r, _ = mpirun(2, ["-m", "hpctrain", "--run-dir", str(d), "--no-progress", "--epochs", "2",
                      "--set", "polish.bn_recompute=true", "--set", "report.tensorboard=true",
                      "--set", "train.eval_every=1", "--set", f"ckpt.every_steps={STEPS_PER_EPOCH}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(top-5 " in r.stdout          # the summary line names top-5 (10 classes)
    return d


def records(run_dir, event):
    return [rec for rec in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if rec["event"] == event]


def test_split(run_dir, split="test"):
    """The split as stored, normalised here with numpy from the run's model.json."""
    spec = json.load(open(os.path.join(run_dir, "model.json")))
    shards = ShardSet(read_index(spec_dataset_dir(spec)), split)
    try:
        x, y = shards.read_range(0, shards.num_samples)
    finally:
        shards.close()
    mean = np.asarray(spec["normalize"]["mean"], np.float32).reshape(-1, 1, 1)
    std = np.asarray(spec["normalize"]["std"], np.float32).reshape(-1, 1, 1)
    return torch.from_numpy((x.astype(np.float32) - mean) / std), torch.from_numpy(np.asarray(y, np.int64))


test_split.__test__ = False      # a helper, not a test


def spec_dataset_dir(spec):
    from mpi4py import MPI

    from hpctrain.data_tools.builtin import resolve_dataset
    return resolve_dataset(spec["dataset"], spec["cache_dir"], MPI.COMM_SELF)


def scores(model, x, y):
    """Plain torch: top-1, top-5, mean cross-entropy over the whole split in one batch."""
    with torch.no_grad():
        logits = model(x)
    n = len(y)
    top5 = int((logits.topk(5, dim=1).indices == y[:, None]).any(1).sum()) / n
    return (int((logits.argmax(1) == y).sum()) / n, top5,
            torch.nn.functional.cross_entropy(logits, y, reduction="sum").double().item() / n)


def export(run_dir, out, *args):
    assert cli_main(["export", str(run_dir), str(out), *args]) == 0
    return out


def checkpoint_model_state(run_dir, step):
    return decode(read_file(os.path.join(run_dir, "checkpoints", checkpoint_name(step)))[1])["trainer"]["model"]


# --- export and load_model ----------------------------------------------------------------------

def test_exported_model_scores_what_the_job_evaluated(run, tmp_path):
    from hpctrain import load_model
    out = export(run, tmp_path / "model.pt")
    meta = json.load(open(tmp_path / "model.json"))
    assert meta["model"] == "digits_cnn" and meta["num_classes"] == 10 and meta["sample_shape"] == [1, 8, 8]
    assert meta["step"] == 2 * STEPS_PER_EPOCH and meta["polished"] is True and meta["weights"] == "model.pt"
    model = load_model(str(out))
    assert not model.training
    top1, top5, loss = scores(model, *test_split(run))
    summary = records(run, "summary")[-1]
    assert top1 == pytest.approx(summary["test_accuracy"], abs=1e-12)
    assert top5 == pytest.approx(summary["test_top5_accuracy"], abs=1e-12)
    assert loss == pytest.approx(summary["test_loss"], rel=1e-5)


def test_the_export_carries_final_polishing(run, tmp_path):
    """The final checkpoint precedes Final Polishing: its BN statistics score another loss than the
    job reported; the export's are the polished ones."""
    from hpctrain.models import build_model
    exported = torch.load(export(run, tmp_path / "m.pt"), weights_only=True)
    raw = checkpoint_model_state(run, 2 * STEPS_PER_EPOCH)
    assert exported.keys() == raw.keys()
    assert not torch.equal(exported["features.1.running_mean"], raw["features.1.running_mean"])
    assert torch.equal(exported["features.0.weight"], raw["features.0.weight"])
    unpolished = build_model("digits_cnn", num_classes=10, in_channels=1)
    unpolished.load_state_dict(raw)
    _, _, loss = scores(unpolished.eval(), *test_split(run))
    assert loss != pytest.approx(records(run, "summary")[-1]["test_loss"], rel=1e-5)


def test_plain_torch_load_safetensors_and_run_dir_agree(run, tmp_path):
    from safetensors.torch import load_file

    from hpctrain import load_model
    plain = torch.load(export(run, tmp_path / "a.pt"), weights_only=True)
    st = load_file(str(export(run, tmp_path / "b.safetensors", "--format", "safetensors")))
    from_run = load_model(str(run)).state_dict()
    assert plain.keys() == st.keys() == from_run.keys()
    for k in plain:
        assert torch.equal(plain[k], st[k]) and torch.equal(plain[k], from_run[k]), k
    assert json.load(open(tmp_path / "b.json"))["weights_format"] == "safetensors"


def test_step_picks_an_earlier_checkpoint_unpolished(run, tmp_path):
    from hpctrain import load_model
    export(run, tmp_path / "e1.pt", "--step", str(STEPS_PER_EPOCH))
    meta = json.load(open(tmp_path / "e1.json"))
    assert meta["step"] == STEPS_PER_EPOCH and meta["polished"] is False
    state = load_model(str(tmp_path / "e1.pt")).state_dict()
    for k, v in checkpoint_model_state(run, STEPS_PER_EPOCH).items():
        assert torch.equal(state[k], v), k
    epoch0 = records(run, "epoch")[0]
    top1, _, loss = scores(load_model(str(tmp_path / "e1.pt")), *test_split(run))
    assert top1 == pytest.approx(epoch0["test_accuracy"], abs=1e-12)
    assert loss == pytest.approx(epoch0["test_loss"], rel=1e-5)


def test_export_refusals_are_one_line(run, tmp_path, capsys):
    assert cli_main(["export", str(run), str(tmp_path / "x.pt"), "--step", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no checkpoint of step 3" in err and "22, 44" in err
    assert cli_main(["export", str(tmp_path), str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model.json: missing" in err
    assert not os.path.exists(tmp_path / "x.pt")


def test_a_corrupt_newest_checkpoint_is_passed_over_untouched(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)                 # a run directory copied elsewhere finds its own checkpoints
    assert json.load(open(copy / "model.json"))["checkpoints"] == "checkpoints"
    newest = copy / "checkpoints" / checkpoint_name(2 * STEPS_PER_EPOCH)
    with open(newest, "r+b") as fh:
        fh.seek(-10, 2)
        fh.write(b"XXXXXXXXXX")
    export(copy, tmp_path / "m.pt")
    assert json.load(open(tmp_path / "m.json"))["step"] == STEPS_PER_EPOCH
    assert "SHA-256 mismatch" in capsys.readouterr().err
    assert newest.exists()                 # an export renames nothing (a resume sets it aside)


def test_safetensors_missing_is_one_line(run, tmp_path, monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "safetensors", None)     # import safetensors raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    assert cli_main(["export", str(run), str(tmp_path / "m.st"), "--format", "safetensors"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'hpctrain[safetensors]'" in err


# --- evaluate -----------------------------------------------------------------------------------

def test_evaluate_at_two_ranks_equals_plain_torch(run):
    from hpctrain import load_model
    top1, top5, loss = scores(load_model(str(run)), *test_split(run))
    r, _ = mpirun(2, ["-m", "hpctrain", "evaluate", str(run)])
    assert r.returncode == 0, r.stderr[-3000:]
    line = r.stdout.strip().splitlines()[-1]
    assert "Final Polishing" in line and "(359 samples, 2 ranks)" in line, line
    assert f"top-1 {100 * top1:.2f}%" in line and f"top-5 {100 * top5:.2f}%" in line, line
    assert f"loss {loss:.4f}" in line, line


def test_evaluate_in_process_on_the_train_split(run):
    from mpi4py import MPI

    from hpctrain import load_model
    from hpctrain.saved.evaluate import evaluate
    result, _ = evaluate(str(run), MPI.COMM_WORLD, split="train")
    top1, top5, loss = scores(load_model(str(run)), *test_split(run, "train"))
    assert result["samples"] == 1438 and result["top1"] == pytest.approx(top1, abs=1e-12)
    assert result["top5"] == pytest.approx(top5, abs=1e-12) and result["loss"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize("field, value, said", [
    ("num_classes", 12, "has classes 12, but the model was trained on classes 10"),
    ("sample_shape", [1, 16, 16], "has sample shape (1, 16, 16), but the model was trained on sample shape (1, 8, 8)"),
])
def test_evaluate_refuses_other_data_naming_both_sides(run, tmp_path, capsys, field, value, said):
    spec = json.load(open(os.path.join(run, "model.json")))
    other = tmp_path / "other"
    shutil.copytree(spec_dataset_dir(spec), other)
    index = json.load(open(other / "index.json"))
    index[field] = value
    if field == "num_classes":
        index["class_names"] = [str(i) for i in range(value)]
    json.dump(index, open(other / "index.json", "w"))
    assert cli_main(["evaluate", str(run), "--data", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and said in err and str(other) in err, err


# --- TensorBoard --------------------------------------------------------------------------------

def test_tensorboard_events_read_back(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(os.path.join(run, "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    steps = [e.step for e in acc.Scalars("train/loss")]
    assert steps == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert len(acc.Scalars("train/lr")) == 2 * STEPS_PER_EPOCH
    epochs = records(run, "epoch")
    acc_events = acc.Scalars("test/accuracy")
    # one value per epoch record, then the summary's (Final Polishing) at the last step
    assert [e.step for e in acc_events[:2]] == [rec["step"] for rec in epochs]
    assert [e.value for e in acc_events[:2]] == pytest.approx([rec["test_accuracy"] for rec in epochs], abs=1e-6)
    assert acc_events[-1].value == pytest.approx(records(run, "summary")[-1]["test_accuracy"], abs=1e-6)
    waits = acc.Scalars("perf/data_wait_share")
    assert [e.value for e in waits] == pytest.approx([rec["data_wait_share"] for rec in epochs], abs=1e-6)
    for rec, e in zip(epochs, acc.Scalars("perf/samples_per_s")):
        assert e.value == pytest.approx(STEPS_PER_EPOCH * 64 / rec["epoch_s"], rel=1e-5)
    for phase, seconds in epochs[0]["phases_s"].items():
        first = acc.Scalars(f"time_per_step_ms/{phase}")[0]
        assert first.value == pytest.approx(1000 * seconds / STEPS_PER_EPOCH, rel=1e-5)
    assert {"train/epoch_loss", "test/top5_accuracy", "test/loss"} <= tags
    assert "train/loss_scale" not in tags          # no loss scaler in this run


def test_tensorboard_missing_is_one_config_line(monkeypatch, tmp_path):
    from hpctrain.job.config import Config, ConfigError, validate
    from hpctrain.ops import tensorboard
    find_spec = tensorboard.importlib.util.find_spec
    monkeypatch.setattr(tensorboard.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else find_spec(name, *a))
    cfg = Config()
    cfg.run.run_dir, cfg.report.tensorboard = str(tmp_path), True
    validate(cfg.__class__())                      # off: no check
    with pytest.raises(ConfigError, match=r"^config report\.tensorboard: .*pip install 'hpctrain\[tensorboard\]'"):
        validate(cfg)
