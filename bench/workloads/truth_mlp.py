"""GPU truth workload: a float32 MLP (4 Linear layers, 8192 wide by default) trained with AdamW.

The case of the GPU-truth issue: fp32 matmuls dominate, the foreach AdamW blocks the host.
Changes applied by hand for treat's A/B: ``--fused`` (AdamW(fused=True)), ``--tf32``
(``set_float32_matmul_precision('high')``), ``--bf16`` (forward and loss under bf16 autocast).
"""
from contextlib import nullcontext

import torch
from torch import nn

from _truth import Clock, parser

p = parser(steps=20, warmup=8)
p.add_argument("--width", type=int, default=8192)
p.add_argument("--batch", type=int, default=4096)
p.add_argument("--fused", action="store_true")
p.add_argument("--tf32", action="store_true")
p.add_argument("--bf16", action="store_true")
a = p.parse_args()
torch.manual_seed(0)
dev = torch.device(a.device)
if a.tf32:
    torch.set_float32_matmul_precision("high")
W = a.width
model = nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W), nn.ReLU(),
                      nn.Linear(W, W), nn.ReLU(), nn.Linear(W, 1024)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if a.fused else {}))
xs = torch.randn(4, a.batch, W, device=dev)
ys = torch.randn(4, a.batch, 1024, device=dev)
clock = Clock(a, torch)
while not clock.done():
    clock.begin()
    x, y = xs[clock.i % 4], ys[clock.i % 4]
    # autocast only when asked: an autocast(enabled=False) region would switch off one that
    # treat's bf16-autocast trial opens around the step
    with torch.autocast(dev.type, dtype=torch.bfloat16) if a.bf16 else nullcontext():
        with clock.phase("forward"):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
    clock.update(loss, opt)
clock.finish(params=sum(p.numel() for p in model.parameters()))
