"""A torchvision-style ResNet (BasicBlocks, BatchNorm2d everywhere, a strided downsample; written
here, no torchvision) under data-parallel plans, where each BatchNorm takes its statistics over its
unit's DP group (SyncBatchNorm semantics), and pipelined plans, against single-process training:
losses, parameters and running statistics. torchvision's own forward (``torch.flatten`` between the
pooling and the classifier) is refused, naming the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autopar.errors import AutoparError
from autopar.plan.compact import make_plan
from autopar.runtime.local_ranks import run_distributed
from autopar.units import units
from tests.runtime.cases import same
from tests.runtime.reference import assert_matches_reference, reference_train

pytestmark = pytest.mark.dist


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class Head(nn.Module):
    def __init__(self, cin: int, classes: int) -> None:
        super().__init__()
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ResNet(nn.Module):
    """torchvision's ResNet layout (conv1, bn1, relu, maxpool, layer1, layer2, classifier), small."""

    def __init__(self, width: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(2)
        self.layer1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, width))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, stride=2), BasicBlock(2 * width, 2 * width))
        self.head = Head(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.head(self.layer2(self.layer1(x)))


UNITS = ["conv1", "bn1", "relu", "maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "head"]


def images() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g)


def ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


PLANS = {
    "dp2": [(8, 1, [([0, 1], same(UNITS))])],
    "dp2-zero1-zero3": [(8, 1, [([0, 1], [(u, {"zero": 3 if i % 2 else 1}) for i, u in enumerate(UNITS)])])],
    "pp2": [(8, 1, [([0], same(UNITS[:5])), ([1], same(UNITS[5:], ckpt="selective"))])],
    "dp4": [(8, 1, [([0, 1, 2, 3], same(UNITS, zero=2))])],
    "pp2-dp2": [(8, 1, [([0, 1], same(UNITS[:6], zero=3)), ([2, 3], same(UNITS[6:]))])],
    "pp4": [(8, 1, [([0], same(UNITS[:2])), ([1], same(UNITS[2:5])), ([2], same(UNITS[5:7])), ([3], same(UNITS[7:]))])],
}


def test_units_are_torchvision_children_in_forward_order():
    assert [n for n, _ in units(ResNet())] == UNITS


@pytest.mark.parametrize("plan", list(PLANS))
def test_resnet_matches_single_process(plan):
    x, y = images()
    assert_matches_reference(ResNet, make_plan(PLANS[plan]), x, y, loss_fn=ce)


def _buffers(rank, world, plan, x, y):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(ResNet(), plan, loss_fn=ce, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    for _ in range(3):
        pm.step(x, y)
    pm.eval()
    out = pm(x)
    return {f"{u}.{k}": v.clone() for u, m in pm.local_units.items() for k, v in m.named_buffers()}, out


@pytest.mark.parametrize("plan", ["dp2", "pp2-dp2"])
def test_running_statistics_and_eval_outputs_equal_single_process(plan):
    """After 3 steps every rank's running means / variances / counts are the single-process ones, and
    the eval-mode output (running statistics) is too."""
    x, y = images()
    plan = make_plan(PLANS[plan])
    got = run_distributed(_buffers, plan.world_size, plan, x, y, timeout_s=60)
    torch.manual_seed(0)
    ref = ResNet()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        ce(ref(x), y).backward()
        opt.step()
    want = dict(ref.named_buffers())
    seen = set()
    for buffers, out in got:
        torch.testing.assert_close(out, ref.eval()(x), atol=1e-5, rtol=1e-5)
        for k, v in buffers.items():
            torch.testing.assert_close(v, want[k], atol=1e-5, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
            seen.add(k)
    assert seen == set(want)
    assert int(want["bn1.num_batches_tracked"]) == 3


class TorchvisionForward(ResNet):
    """torchvision's ResNet.forward: avgpool, then torch.flatten in the model's own forward, then fc."""

    def __init__(self) -> None:
        super().__init__()
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 5)
        del self.head

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(x, 1))


def test_torchvisions_own_forward_is_refused_naming_flatten():
    with pytest.raises(AutoparError, match=r"^model: TorchvisionForward.forward runs call_function 'flatten' after "
                       r"unit avgpool, outside every unit; make forward\(\) pass one tensor"):
        units(TorchvisionForward())


def _compiled(rank, world, plan, x, y):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(ResNet(), plan, loss_fn=ce, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
              compile={"backend": "aot_eager"})
    return [pm.step(x, y) for _ in range(2)]


def test_synced_batchnorm_under_torch_compile():
    """Each unit compiled (aot_eager): the DP-group statistics trace without a graph break and give the
    single-process losses."""
    x, y = images()
    out = run_distributed(_compiled, 2, make_plan(PLANS["dp2"]), x, y, timeout_s=300)
    expected, _ = reference_train(ResNet, x, y, steps=2, lr=0.1, loss_fn=ce)
    assert out[0] == out[1]
    torch.testing.assert_close(torch.tensor(out[0]), torch.tensor(expected), atol=1e-5, rtol=1e-5)


def _resume_phase(rank, world, plan, path, load, x, y):
    from autopar.runtime import wrap

    torch.manual_seed(0)
    pm = wrap(ResNet(), plan, loss_fn=ce, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    if load:
        pm.load(path)
    losses = [pm.step(x, y) for _ in range(2)]
    if not load:
        pm.save(path)
        return losses, None
    pm.eval()
    return losses, pm(x)


def test_resume_under_another_plan_keeps_the_running_statistics(tmp_path):
    """2 steps on dp2 (synced statistics), save, load on a pipeline (pp2-dp2, 4 ranks), 2 more steps:
    the losses and the eval output (running statistics) equal 4 uninterrupted steps on one process."""
    x, y = images()
    path = tmp_path / "ckpt"
    first = run_distributed(_resume_phase, 2, make_plan(PLANS["dp2"]), path, False, x, y, timeout_s=60)
    second = run_distributed(_resume_phase, 4, make_plan(PLANS["pp2-dp2"]), path, True, x, y, timeout_s=60)
    torch.manual_seed(0)
    ref = ResNet()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    expected = []
    for _ in range(4):
        loss = ce(ref(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        expected.append(loss.item())
    torch.testing.assert_close(torch.tensor(first[0][0] + second[0][0]), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    for _, out in second:
        torch.testing.assert_close(out, ref.eval()(x), atol=1e-5, rtol=1e-5)
