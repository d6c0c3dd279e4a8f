"""GPU truth workload: a small ResNet-style conv net (float32) on 128x128 images, SGD momentum.

Changes applied by hand for treat's A/B: ``--channels-last``, ``--cudnn-benchmark``, ``--tf32``.
"""
import torch
from torch import nn

from _truth import Clock, parser

p = parser(steps=20, warmup=8)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--size", type=int, default=128)
p.add_argument("--channels-last", action="store_true")
p.add_argument("--cudnn-benchmark", action="store_true")
p.add_argument("--tf32", action="store_true")
a = p.parse_args()
torch.manual_seed(0)
dev = torch.device(a.device)
# flags set only when asked (a script that assigns them False would undo treat's trial)
if a.cudnn_benchmark:
    torch.backends.cudnn.benchmark = True
if a.tf32:
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


model = nn.Sequential(block(3, 64, 1), block(64, 128, 2), block(128, 256, 2), block(256, 512, 2),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100)).to(dev)
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
model = model.to(memory_format=fmt)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
xs = torch.randn(4, a.batch, 3, a.size, a.size, device=dev)
ys = torch.randint(0, 100, (4, a.batch), device=dev)
clock = Clock(a, torch)
while not clock.done():
    clock.begin()
    x = xs[clock.i % 4].contiguous(memory_format=fmt)
    y = ys[clock.i % 4]
    with clock.phase("forward"):
        out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    clock.update(loss, opt)
clock.finish(params=sum(p.numel() for p in model.parameters()))
