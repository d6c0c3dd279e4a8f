"""GPU truth workload: data-bound. A map-style Dataset whose ``__getitem__`` does CPU work per
sample (a few small matmuls standing in for decode and augmentation), ``num_workers=0``, a small
conv net on the GPU.

Changes applied by hand for treat's A/B: ``--workers N`` (persistent, prefetch 2), ``--pin``
(pin_memory=True and non_blocking copies).
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _truth import Clock, parser

p = parser(steps=16, warmup=8)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--pin", action="store_true")
p.add_argument("--batch", type=int, default=16)
p.add_argument("--work", type=int, default=2)
a = p.parse_args()
torch.manual_seed(0)
# one intra-op thread for the per-sample work (as in a DataLoader worker): tiny matmuls on every
# core of a 32-core host made the step time swing 10x run to run
torch.set_num_threads(1)
dev = torch.device(a.device)


class Noisy(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, 64, 64, generator=g)
        m = torch.rand(64, 64, generator=g)
        for _ in range(a.work):  # decode/augment stand-in: CPU work per sample
            img = torch.tanh(img @ m) * 0.5
        return img, i % 10


kw = {"persistent_workers": True, "prefetch_factor": 2} if a.workers else {}
loader = DataLoader(Noisy(), batch_size=a.batch, shuffle=True, num_workers=a.workers,
                    pin_memory=a.pin, **kw)
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
clock = Clock(a, torch)
for x, y in loader:
    clock.begin()
    x, y = x.to(dev, non_blocking=a.pin), y.to(dev, non_blocking=a.pin)
    with clock.phase("forward"):
        out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    clock.update(loss, opt)
    if clock.done():
        break
clock.finish()
