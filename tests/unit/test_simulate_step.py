"""Step-time model: overlap pipeline, stragglers, loading, scaling table, validation errors."""
import pytest

from hpctrain.tools.sim.presets import DEVICES, NETWORKS, images_per_s
from hpctrain.tools.sim.step import (Scenario, bucket_sizes, exposed_comm_s, gpu_counts, predict,
                               scaling_table, straggler_factor)
from hpctrain.tools.sim.validate import CASES, validation_rows


def test_exposed_comm_limits_by_hand():
    # fast network: every bucket finishes before the next is ready; only the last one shows
    assert exposed_comm_s([1.0, 1.0, 1.0], backward_s=30.0) == pytest.approx(1.0)
    # slow network: ready at 2, 4, 6; serial 10 s each → ends at 32; backward ends at 6
    assert exposed_comm_s([10.0, 10.0, 10.0], backward_s=6.0) == pytest.approx(26.0)
    assert exposed_comm_s([10.0, 10.0, 10.0], backward_s=6.0, overlap=False) == pytest.approx(30.0)


def test_bucket_sizes_cover_the_gradient():
    sizes = bucket_sizes(102.2e6, 25e6)
    assert len(sizes) == 5 and sum(sizes) == pytest.approx(102.2e6)
    assert bucket_sizes(1e3, 25e6) == [1e3]


def test_straggler_factor_matches_expected_maximum_of_normals():
    assert straggler_factor(1, 0.1) == 1.0 and straggler_factor(512, 0.0) == 1.0
    # E[max of 2 standard normals] = 1/√π; of 1000 ≈ 3.241 (order-statistics tables)
    assert straggler_factor(2, 0.1) - 1 == pytest.approx(0.1 / 3.14159265 ** 0.5, abs=3e-3)
    assert straggler_factor(1000, 0.1) - 1 == pytest.approx(0.3241, abs=3e-3)


def test_one_gpu_runs_at_the_published_device_rate():
    sc = Scenario(model="resnet50", device="v100", precision="amp")
    p = predict(sc, 1)
    assert p.batch_per_gpu == 256 and p.images_per_s == pytest.approx(1200.0)
    assert p.comm_s == 0.0 and p.exposed_comm_s == 0.0


def test_two_nodes_without_overlap_by_hand():
    # one bucket, one GPU per node, ring over eth-10g: step = compute + 2·½·n·β + ½·n·γ + 2α
    sc = Scenario(model="resnet50", device="v100", step_time_s=0.3, batch_per_gpu=32, gpus_per_node=1,
                  net="eth-10g", algo="ring", bucket_mb=1e6, overlap=False)
    n = 25.557e6 * 4
    beta = 1 / (10 / 8 * 1e9 * 0.9)
    gamma = 3 / (900 * 1e9)
    comm = 2 * 25e-6 + n * beta + 0.5 * n * gamma
    p = predict(sc, 2)
    assert p.step_s == pytest.approx(0.3 + comm, rel=1e-9)
    assert p.images_per_s == pytest.approx(64 / (0.3 + comm), rel=1e-9)


def test_loader_bound_step():
    sc = Scenario(device="v100", precision="amp", loader_img_s=600.0)
    assert predict(sc, 8).images_per_s == pytest.approx(8 * 600.0)


def test_scaling_table_rows():
    sc = Scenario(net="roce-25g", algo="ring")
    rows = scaling_table(sc, gpu_counts(64), epochs=90, dataset_size=1_281_167)
    assert [r["gpus"] for r in rows] == [1, 2, 4, 8, 16, 32, 64]
    assert rows[0]["efficiency_pct"] == pytest.approx(100.0)
    effs = [r["efficiency_pct"] for r in rows]
    assert all(b <= a + 1e-9 for a, b in zip(effs, effs[1:])) and effs[-1] < 100.0
    for r in rows:
        assert r["time_to_train_h"] * 3600 == pytest.approx(90 * 1_281_167 / r["images_per_s"])
        assert r["gpu_h_per_epoch"] == pytest.approx(r["time_to_train_h"] * r["gpus"] / 90)


def test_gpu_counts():
    assert gpu_counts(24) == [1, 2, 4, 8, 16, 24]
    counts = gpu_counts(4096)
    assert counts[0] == 1 and counts[-1] == 4096 and len(counts) == 13


def test_fp16_gradients_reduce_exposed_comm_on_a_slow_network():
    base = Scenario(net="eth-10g", algo="ring", precision="amp")
    fp16 = Scenario(net="eth-10g", algo="ring", precision="amp", compression="fp16")
    assert predict(fp16, 64).comm_s < 0.6 * predict(base, 64).comm_s


def test_device_rates_fall_back_and_scale():
    rate, batch, src = images_per_s("p100", "resnet50", "amp")
    assert rate == 238.0 and batch == 64 and "fp32" in src
    rate, _, src = images_per_s("v100", "vgg16", "amp")
    assert rate == pytest.approx(1200.0 * 4.1 / 15.5) and "scaled" in src
    assert NETWORKS["ib-edr"].link().beta_s_per_byte == pytest.approx(1 / 11.25e9)
    assert DEVICES["cpu"].fp16_convert_s_per_elem == 0.15e-9


def test_validation_errors_are_absolute_differences():
    rows = validation_rows()
    assert len(rows) == len(CASES)
    for r, case in zip(rows, CASES):
        assert r["error_pts"] == pytest.approx(abs(r["predicted_pct"] - r["published_pct"]))
        # independent path: the scaling table's efficiency for the same scenario and baseline
        eff = scaling_table(case.scenario, [case.gpus], baseline_gpus=case.baseline_gpus)[0]
        assert r["predicted_pct"] == pytest.approx(eff["efficiency_pct"])
    assert {r["published_pct"] for r in rows} >= {97.5, 90.0, 68.0}


def test_alpha_overrides_apply_after_presets_and_calibration():
    from hpctrain.tools.sim.costs import Link
    from hpctrain.tools.sim.step import scenario_links
    sc = Scenario(net="ib-edr", inter_link=Link(1e-6, 1e-9), inter_alpha_s=9e-6, intra_alpha_s=2e-6)
    intra, inter = scenario_links(sc)
    assert (inter.alpha_s, inter.beta_s_per_byte, intra.alpha_s) == (9e-6, 1e-9, 2e-6)
    # a larger α can only slow a 512-rank ring down
    slow = Scenario(net="roce-25g", algo="ring", inter_alpha_s=20e-6)
    assert predict(slow, 512).comm_s > predict(Scenario(net="roce-25g", algo="ring"), 512).comm_s


def test_nccl_variant_changes_only_horovod_latency():
    from hpctrain.tools.sim.validate import NCCL_NET_HOP_ALPHA_S, nccl_latency_variant
    variant = nccl_latency_variant()
    assert len(variant) == 6 and all(c.name.startswith("horovod") for c in variant)
    assert all(c.scenario.inter_alpha_s == NCCL_NET_HOP_ALPHA_S for c in variant)
