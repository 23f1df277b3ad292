"""Small models shared by the tests, examples and benchmarks."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """The MNIST model of the Cerebras docs."""

    def __init__(self, sizes=(784, 256, 10)):
        super().__init__()
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(nn.Flatten(), *layers[:-1])

    def forward(self, x):
        return self.net(x)


class SmallCNN(nn.Module):
    """conv-BN-ReLU-maxpool x2, avg and adaptive pooling, a linear head."""

    def __init__(self, channels=8, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1, stride=1)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2, ceil_mode=True)
        self.head = nn.Linear(2 * channels * 4, classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = F.adaptive_avg_pool2d(self.avg(x), (2, 2))
        return self.head(torch.flatten(x, 1))


class MnistNet(nn.Module):
    """pytorch/examples' MNIST network without its dropout layers: two 3x3 convolutions,
    max-pool, two linear layers, log-softmax. ``channels``, ``hidden`` and the square ``image``
    size shrink it for tests (the example: (32, 64), 128, 28)."""

    def __init__(self, channels=(32, 64), hidden=128, image=28):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels[0], 3, 1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, 1)
        self.fc1 = nn.Linear(channels[1] * ((image - 4) // 2) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = torch.flatten(F.max_pool2d(x, 2), 1)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class TinyGPT(nn.Module):
    """A small GPT: token+position embeddings, pre-LN blocks, tied head."""

    def __init__(self, vocab=128, d=64, heads=4, layers=2, seq=32, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        for block in self.blocks:
            nn.init.normal_(block.out.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx, mask=None):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def small_gpt(vocab=64, seq=16):
    """A seeded two-block TinyGPT (d 32, 2 heads): the same initial weights on every call."""
    torch.manual_seed(0)
    return TinyGPT(vocab=vocab, d=32, heads=2, layers=2, seq=seq)


def repeated_token_batches(n, vocab=64, seq=16):
    """One batch of 4 random token sequences, repeated ``n`` times: the model learns it, so the
    loss falls."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (4, seq + 1), generator=g)
    return [(tokens[:, :-1], tokens[:, 1:])] * n
