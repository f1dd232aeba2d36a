"""The Horovod-style examples run at -n 2 as a Horovod user launches them (a few steps each)."""
import os
import re

from tests.integration.mpirun import mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "horovod")


def example(name):
    return os.path.join(EXAMPLES, name)


def test_examples_import_hvd_from_hpctrain_only():
    """Their hpctrain imports are the changed Horovod line (and the torchvision stand-in)."""
    for name in ("pytorch_synthetic_benchmark.py", "pytorch_digits.py"):
        with open(example(name)) as f:
            imports = [line.strip() for line in f if re.match(r"\s*(import|from)\s+hpctrain", line)]
        assert imports[0] == "import hpctrain.horovod.torch as hvd", (name, imports)
        assert set(imports[1:]) <= {"from hpctrain.models import resnet as models"}, (name, imports)


def test_synthetic_benchmark_reports_throughput():
    r, _ = mpirun(2, [example("pytorch_synthetic_benchmark.py"), "--model", "resnet18", "--batch-size", "4",
                      "--image-size", "32", "--num-classes", "10", "--num-warmup-batches", "1",
                      "--num-batches-per-iter", "2", "--num-iters", "2", "--fp16-allreduce"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "compression=fp16" in r.stderr, r.stderr[-2000:]
    per_rank = float(re.search(r"Img/sec per CPU: ([\d.]+)", r.stdout).group(1))
    total = float(re.search(r"Total img/sec on 2 CPU\(s\): ([\d.]+)", r.stdout).group(1))
    assert per_rank > 0 and abs(total - 2 * per_rank) < 0.2, r.stdout


def test_digits_trains_to_a_sane_accuracy():
    r, _ = mpirun(2, [example("pytorch_digits.py"), "--epochs", "4", "--batches-per-allreduce", "2",
                      "--batch-size", "16"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    accuracies = [float(a) for a in re.findall(r"accuracy ([\d.]+)%", r.stdout)]
    assert len(accuracies) == 4, r.stdout
    # 10 classes: chance is 10 %; four short epochs of this CNN reach well above 80 %.
    assert accuracies[-1] > 80, r.stdout
