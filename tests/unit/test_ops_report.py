"""``python -m hpctrain report``: figures from metrics.jsonl against hand-computed values, and plots."""
import json

import pytest

from hpctrain.ops import report


def write_run(path, *, world, samples_per_s, wall_s, epochs=3, spe=10, gb=64, stopped=False, start_step=0):
    path.mkdir(parents=True, exist_ok=True)
    recs = [{"event": "config", "config": {"train": {"batch_size": gb}}, "world_size": world,
             "steps_per_epoch": spe, "start_step": start_step}]
    for e in range(start_step // spe, epochs):
        recs.append({"event": "epoch", "epoch": e, "step": (e + 1) * spe, "train_loss": 1.0 / (e + 1),
                     "lr": 0.1 * (epochs - e) / epochs, "epoch_s": 2.0 + e, "test_accuracy": 0.5 + 0.1 * e,
                     "phases_s": {"data": 0.1, "forward": 0.4, "backward": 0.8, "allreduce": 0.5, "optimizer": 0.2}})
    if stopped:
        recs.append({"event": "stopped", "signal": "SIGTERM", "step": 25, "checkpoint": "x/ckpt-000000025.pt"})
    else:
        recs.append({"event": "summary", "test_accuracy": 0.97, "samples_per_s": samples_per_s, "wall_s": wall_s,
                     "train_s": wall_s - 1, "world_size": world, "steps": epochs * spe, "epochs": float(epochs),
                     "global_batch": gb, "start_step": start_step, "gpu_time_s": wall_s * world,
                     "avg_single_gpu_time_per_epoch_s": wall_s * world / epochs,
                     "phases_s": {"data": 1.0, "forward": 2.0, "backward": 4.0, "allreduce": 2.0, "optimizer": 1.0}})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_scaling_against_a_baseline(tmp_path):
    run = report.load_run(str(write_run(tmp_path / "r8", world=8, samples_per_s=6000.0, wall_s=100.0)))
    base = report.load_run(str(write_run(tmp_path / "r1", world=1, samples_per_s=1000.0, wall_s=600.0)))
    f = report.figures(run, base)
    assert f["speedup"] == pytest.approx(6.0) and f["ideal_speedup"] == 8
    assert f["scaling_efficiency"] == pytest.approx(6.0 / 8)
    assert f["gpu_hours"] == pytest.approx(100.0 * 8 / 3600)
    assert f["avg_single_gpu_time_per_epoch_s"] == pytest.approx(800 / 3)
    assert f["gpu_time_ratio"] == pytest.approx((800 / 3) / (600 / 3))
    assert f["phase_share"] == pytest.approx({"data": 0.1, "forward": 0.2, "backward": 0.4, "allreduce": 0.2,
                                              "optimizer": 0.1})
    text = report.format_report(f)
    assert "scaling efficiency      75.0%" in text and "6.00x of an ideal 8.00x" in text


def test_epoch_throughput_counts_steps_since_the_resume(tmp_path):
    run = report.load_run(str(write_run(tmp_path / "r", world=2, samples_per_s=1.0, wall_s=9.0, start_step=15)))
    assert [e["epoch"] for e in run.epochs] == [1, 2]
    # epoch 1 ran steps 15..20 (5 steps of 64) in 3 s; epoch 2 ran 10 steps in 4 s
    assert report.epoch_samples_per_s(run) == pytest.approx([5 * 64 / 3.0, 10 * 64 / 4.0])


def test_stopped_run_reports_phases_from_epochs(tmp_path):
    run = report.load_run(str(write_run(tmp_path / "s", world=2, samples_per_s=0, wall_s=0, stopped=True)))
    f = report.figures(run)
    assert f["stopped"]["signal"] == "SIGTERM" and f["samples_per_s"] is None
    assert report.phase_breakdown(run)["backward"] == pytest.approx(3 * 0.8)
    assert "stopped                 by SIGTERM at step 25" in report.format_report(f)


def test_cli_writes_pngs_and_json(tmp_path, capsys):
    r8 = write_run(tmp_path / "r8", world=8, samples_per_s=6000.0, wall_s=100.0)
    r1 = write_run(tmp_path / "r1", world=1, samples_per_s=1000.0, wall_s=600.0)
    assert report.main([str(r8), "--baseline", str(r1)]) == 0
    names = {"loss.png", "accuracy.png", "lr.png", "throughput.png", "phases.png"}
    assert {p.name for p in (r8 / "report").iterdir()} == names
    for name in names:
        assert (r8 / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert report.main([str(r8), "--baseline", str(r1), "--json", "--no-plots"]) == 0
    assert json.loads(capsys.readouterr().out)["scaling_efficiency"] == pytest.approx(0.75)


def test_cli_error_names_the_missing_file(tmp_path, capsys):
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "metrics.jsonl: not found" in capsys.readouterr().err


def test_reads_a_real_run(tmp_path, capsys):
    """The fields the job writes are the ones the report reads (a 1-rank, 3-step run, in process)."""
    from tests.integration.inprocess import run_cli
    r = run_cli(capsys, "--run-dir", str(tmp_path), "--no-progress", "--max-steps", "3", "--set", "ckpt.keep=1")
    assert r.returncode == 0, r.stderr
    f = report.figures(report.load_run(str(tmp_path)))
    assert f["steps"] == 3 and f["world_size"] == 1 and f["samples_per_s"] > 0
    assert set(f["phase_share"]) >= {"data", "forward", "backward", "allreduce", "optimizer"}
