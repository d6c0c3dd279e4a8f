"""GPU truth workload: host-bound. A deep, narrow MLP (many small kernels) whose loop reads the
loss with ``.item()`` every step and clips gradients with a per-parameter Python loop: the
host launches and waits; the GPU idles between kernels.
"""
import torch
from torch import nn

from _truth import Clock, parser

p = parser(steps=30, warmup=8)
p.add_argument("--depth", type=int, default=24)
p.add_argument("--width", type=int, default=256)
a = p.parse_args()
torch.manual_seed(0)
dev = torch.device(a.device)
layers = []
for _ in range(a.depth):
    layers += [nn.Linear(a.width, a.width), nn.LayerNorm(a.width), nn.GELU()]
model = nn.Sequential(*layers, nn.Linear(a.width, 1)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, a.width, device=dev)
y = torch.randn(64, 1, device=dev)
clock = Clock(a, torch)
running = 0.0
while not clock.done():
    clock.begin()
    with clock.phase("forward"):
        out = model(x)
    loss = nn.functional.mse_loss(out, y)
    opt.zero_grad()
    with clock.phase("backward"):
        loss.backward()
    for prm in model.parameters():  # per-tensor clipping in Python: many tiny launches
        prm.grad.clamp_(-1.0, 1.0)
    with clock.phase("optimizer"):
        opt.step()
    running += loss.item()  # a host sync every step
    clock.end(loss)
clock.finish(running=running)
