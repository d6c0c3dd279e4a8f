"""torchdoctor demo: a small image classifier whose data pipeline is the bottleneck.

The Dataset "augments" every sample with a chain of tiny tensor ops in __getitem__, in the
main process (num_workers=0): the model waits for data most of each step. Run it alone with
``python slow_loader_train.py``; ``torchdoctor demo`` runs it under ``checkup``.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
torch.set_num_threads(1)


class NoisyShapes(Dataset):
    """8x8 single-channel images of 4 classes (a bright quadrant), with per-sample jitter."""

    def __len__(self) -> int:
        return 2048

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        label = i % 4
        img = 0.1 * torch.randn(1, 8, 8, generator=g)
        r, c = divmod(label, 2)
        img[:, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 1.0
        for _ in range(60):  # the bottleneck: a per-sample "augmentation" of many tiny ops
            img = img + 0.002 * torch.randn(1, 8, 8, generator=g)
        return img, label


model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(NoisyShapes(), batch_size=32, shuffle=True)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
