"""GPU truth workload: a model under ``torch.compile`` (an MLP-mixer-style stack of bf16 blocks),
compiled once before the loop; its compile steps fall in the warm-up.
"""
import torch
from torch import nn

from _truth import Clock, parser

p = parser(steps=20, warmup=10)
p.add_argument("--dim", type=int, default=2048)
p.add_argument("--depth", type=int, default=6)
p.add_argument("--batch", type=int, default=8192)
a = p.parse_args()
torch.manual_seed(0)
dev = torch.device(a.device)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


model = nn.Sequential(*[Block(a.dim) for _ in range(a.depth)], nn.Linear(a.dim, 10)).to(dev)
model.compile()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
xs = torch.randn(4, a.batch, a.dim, device=dev)
ys = torch.randint(0, 10, (4, a.batch), device=dev)
clock = Clock(a, torch)
while not clock.done():
    clock.begin()
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        with clock.phase("forward"):
            out = model(xs[clock.i % 4])
        loss = nn.functional.cross_entropy(out.float(), ys[clock.i % 4])
    clock.update(loss, opt)
clock.finish()
