"""Where does the training thread of a pinned-DataLoader GPU loop block? The script's own answer.

``dataloader-bound`` on the ``gpu_healthy`` fixtures (tests/fixtures/scripts/{perf,profile}/) was
raised on an H200 host: about half of each step spent waiting for data. Before judging the rule
or the fixture, this bench measures the fixture's loops plainly, the careful way, on the GPU:

* ``sync``: per step, ``torch.cuda.synchronize()`` at the end, wall time of the step and the host
  time spent inside ``next(loader)`` (what the loop itself would call data wait);
* ``nosync``: the same loop as the fixture runs it (no sync in the loop), ``next()`` timed the
  same way, the window closed by one synchronize: if ``next()`` takes long only here, the host
  blocks in it because it ran ahead of the GPU (pinning waits for the GPU), not for data;
* ``resident``: the same model and step on one batch already on the GPU (no loader): the step the
  GPU needs without any data path: the floor;
* ``nopin``: the loader without ``pin_memory`` (pageable copies), for the same comparison.

Also records ``torch.cuda.host_memory_stats()`` (where present) before and after: whether the
pinned-memory cache allocates new blocks every step.

    OUT=$OUT python3 bench/loader_truth.py [--steps 60] [--workload mlp|conv]

Writes ``$OUT/loader_truth.json`` (when OUT is set) and prints one line per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Batches(Dataset):
    """The profile fixture's data: ready-made batches handed over (and pinned) by the loader."""

    def __init__(self, n=4, b=8192, d=16):
        self.x, self.y = torch.randn(n, b, d), torch.randn(n, b, 1)

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return self.x[i % len(self.x)], self.y[i % len(self.y)]


def mlp_workload(pin: bool):
    d, w = 16, 4096
    model = nn.Sequential(nn.Linear(d, w), nn.GELU(), *[m for _ in range(4) for m in (nn.Linear(w, w), nn.GELU())],
                          nn.Linear(w, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    loader = DataLoader(Batches(), batch_size=None, pin_memory=pin)

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loader, step


def conv_workload(pin: bool):
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True), nn.MaxPool2d(2))
    model = nn.Sequential(block(3, 64), block(64, 128), block(128, 256), block(256, 256),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10)).cuda()
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = TensorDataset(torch.randn(4096, 3, 64, 64), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=256, shuffle=True, num_workers=4, pin_memory=pin,
                        persistent_workers=True)

    def step(x, y):
        x = x.to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loader, step


def forever(loader):
    while True:
        yield from loader


def measure(workload, variant: str, steps: int, warm: int = 10) -> dict:
    pin = variant != "nopin"
    loader, step = workload(pin)
    it = forever(loader)
    waits, steps_s = [], []
    x0, y0 = next(it)
    x0, y0 = x0.cuda(), y0.cuda()
    stats0 = _host_stats()
    torch.cuda.synchronize()
    t_win = time.perf_counter()
    for i in range(warm + steps):
        t0 = time.perf_counter()
        if variant == "resident":
            x, y = x0, y0
        else:
            x, y = next(it)
        t1 = time.perf_counter()
        if variant != "resident":
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        step(x, y)
        if variant in ("sync", "resident", "nopin"):
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i == warm - 1:
            torch.cuda.synchronize()
            t_win = time.perf_counter()
        if i >= warm:
            waits.append(t1 - t0)
            steps_s.append(t2 - t0)
    torch.cuda.synchronize()
    window = time.perf_counter() - t_win
    stats1 = _host_stats()
    return {"variant": variant, "steps": steps,
            "window_ms_per_step": 1e3 * window / steps,
            "median_step_ms": 1e3 * statistics.median(steps_s),
            "median_next_ms": 1e3 * statistics.median(waits),
            "mean_next_ms": 1e3 * statistics.fmean(waits),
            "next_share_of_window": sum(waits) / window,
            "host_alloc_stats": {k: stats1.get(k, 0) - stats0.get(k, 0) for k in stats1
                                 if isinstance(stats1.get(k), (int, float))
                                 and ("alloc" in k.lower() or "free" in k.lower())}}


def _host_stats() -> dict:
    fn = getattr(torch.cuda, "host_memory_stats", None)
    try:
        return dict(fn()) if fn else {}
    except Exception:  # noqa: BLE001 - optional statistics
        return {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--workload", choices=("mlp", "conv", "both"), default="both")
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    names = ("mlp", "conv") if a.workload == "both" else (a.workload,)
    for name in names:
        wl = mlp_workload if name == "mlp" else conv_workload
        for variant in ("sync", "nosync", "resident", "nopin"):
            r = measure(wl, variant, a.steps)
            r["workload"] = name
            rows.append(r)
            print(f"{name:5s} {variant:9s} window {r['window_ms_per_step']:7.2f} ms/step  "
                  f"median step {r['median_step_ms']:7.2f}  next() median {r['median_next_ms']:6.2f} "
                  f"mean {r['mean_next_ms']:6.2f} ms  share {r['next_share_of_window']:.2f}  "
                  f"host allocs {r['host_alloc_stats']}", flush=True)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "loader_truth.json"), "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
