"""Independent eager-torch references for cstorch numerics, written from the published
cerebras-pytorch 2.10 formulas (not from this project's JAX code)."""

import math

import torch


class EagerCstorchAdamW:
    """cerebras-pytorch AdamW: eps added to sqrt(v) before the bias correction, beta powers
    kept per parameter and starting at beta, decoupled weight decay."""

    def __init__(self, params, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        self.params = list(params)
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.state = {
            p: dict(
                exp_avg=torch.zeros_like(p),
                exp_avg_sq=torch.zeros_like(p),
                beta1_power=torch.tensor(self.beta1),
                beta2_power=torch.tensor(self.beta2),
            )
            for p in self.params
        }

    @torch.no_grad()
    def step(self, lr):
        for p in self.params:
            if p.grad is None:
                continue
            s = self.state[p]
            s["exp_avg"].mul_(self.beta1).add_(p.grad, alpha=1 - self.beta1)
            s["exp_avg_sq"].mul_(self.beta2).addcmul_(p.grad, p.grad, value=1 - self.beta2)
            update = s["exp_avg"] / (s["exp_avg_sq"].sqrt() + self.eps)
            update *= torch.sqrt(1 - s["beta2_power"]) / (1 - s["beta1_power"])
            s["beta1_power"] *= self.beta1
            s["beta2_power"] *= self.beta2
            update += p * self.weight_decay
            p.sub_(update * lr)

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def linear_lr(t, initial, end, total):
    return end if t >= total else (initial - end) * (1 - t / total) + end


def cosine_decay_lr(t, initial, end, total):
    return end + (initial - end) * 0.5 * (1 + math.cos(math.pi * min(t, total) / total))
