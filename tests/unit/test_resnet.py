"""ResNet definitions: published parameter counts, output shapes, v1.5 stride, zero-init."""
import pytest
import torch

from hpctrain.models.resnet import Bottleneck, resnet18, resnet20, resnet50

torch.set_num_threads(1)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_published_parameter_counts():
    assert n_params(resnet50()) == 25_557_032          # torchvision resnet50
    assert n_params(resnet18()) == 11_689_512          # torchvision resnet18
    # He et al. Table 6: 0.27 M. Option A (their CIFAR choice) has no shortcut parameters;
    # option B (projections) matches osmr/imgclsmob's resnet20_cifar10 count.
    assert n_params(resnet20()) == 269_722
    assert n_params(resnet20(shortcut="B")) == 272_474
    assert n_params(resnet50(num_classes=10)) == 25_557_032 - (2048 + 1) * 990


def test_output_shapes_and_in_channels():
    torch.manual_seed(0)
    with torch.no_grad():
        assert resnet18().eval()(torch.randn(1, 3, 224, 224)).shape == (1, 1000)
        assert resnet50(num_classes=7).eval()(torch.randn(2, 3, 64, 64)).shape == (2, 7)
        assert resnet20().eval()(torch.randn(3, 3, 32, 32)).shape == (3, 10)
        assert resnet20(in_channels=1, num_classes=4).eval()(
            torch.randn(2, 1, 32, 32)).shape == (2, 4)


def test_resnet50_is_v1_5():
    blocks = [m for m in resnet50().modules() if isinstance(m, Bottleneck)]
    assert len(blocks) == 16
    first_of_stage2 = blocks[3]
    assert first_of_stage2.conv1.stride == (1, 1) and first_of_stage2.conv2.stride == (2, 2)


def test_resnet20_option_a_shortcut_pads_channels():
    m = resnet20().eval()
    block = m.stages[1][0]
    x = torch.randn(1, 16, 8, 8)
    y = block.shortcut(x)
    assert y.shape == (1, 32, 4, 4)
    assert torch.equal(y[:, 8:24], x[:, :, ::2, ::2]) and y[:, :8].abs().sum() == 0


@pytest.mark.parametrize("factory", [resnet18, resnet20])
def test_zero_init_residual_makes_blocks_identity(factory):
    torch.manual_seed(0)
    model = factory(zero_init_residual=True).eval()
    blocks = [b for stage in model.stages for b in stage]
    assert all(torch.count_nonzero(b.last_bn().weight) == 0 for b in blocks)
    assert torch.count_nonzero(model.stem[1].weight) > 0
    x = torch.relu(torch.randn(1, blocks[0].conv1.in_channels, 8, 8))
    with torch.no_grad():                       # identity block: relu(0 + x) == x for x >= 0
        assert torch.allclose(blocks[0](x), x)
    plain = factory().eval()
    assert all(torch.count_nonzero(b.last_bn().weight) > 0 for s in plain.stages for b in s)
