"""GPU truth workload: a stack of bf16 transformer blocks (pre-norm, causal attention through
scaled_dot_product_attention) with a token embedding and head, fused AdamW, bf16 autocast.

Change applied by hand for treat's A/B: ``--compile`` (``model.compile()``).
"""
import torch
from torch import nn
from torch.nn import functional as F

from _truth import Clock, parser

p = parser(steps=20, warmup=8)
p.add_argument("--layers", type=int, default=8)
p.add_argument("--dim", type=int, default=1024)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--compile", action="store_true")
a = p.parse_args()
torch.manual_seed(0)
dev = torch.device(a.device)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.dim)
        self.blocks = nn.ModuleList(Block(a.dim, 16) for _ in range(a.layers))
        self.norm = nn.LayerNorm(a.dim)
        self.head = nn.Linear(a.dim, a.vocab, bias=False)

    def forward(self, idx):
        h = self.tok(idx)
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.norm(h))


model = LM().to(dev)
if a.compile:
    model.compile()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev.type == "cuda")
data = torch.randint(0, a.vocab, (4, a.batch, a.seq + 1), device=dev)
clock = Clock(a, torch)
while not clock.done():
    clock.begin()
    batch = data[clock.i % 4]
    x, y = batch[:, :-1], batch[:, 1:]
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        with clock.phase("forward"):
            logits = model(x)
        loss = F.cross_entropy(logits.view(-1, a.vocab).float(), y.reshape(-1))
    clock.update(loss, opt)
clock.finish(params=sum(p.numel() for p in model.parameters()))
