"""A training run stopped by Ctrl-C and saved in ``except KeyboardInterrupt``, as the
checkpoints page shows, then resumed from that save (run by test_interrupts.py).

``python interrupted_training.py OUT.json [--steps N] [--interrupt-at K --where W]
[--wait-for FILE] [--resume CKPT] [--engine jax|eager]``

Ctrl-C (a real SIGINT, sent to this process) arrives at step ``K`` (1-based) where ``W`` says:
``body`` in the loop body before the step is called, ``loader`` while the executor draws
that step's batch, ``closure`` in the step's closure, ``forward`` inside the model's forward
pass (mid-step on the eager engine). With ``--wait-for FILE`` nothing is sent: the loop body
of step K prints ``waiting`` and waits until FILE exists (the test sends SIGINT meanwhile).
The data position is the saved step (``--position step``, the checkpoints page's script) or a
restartable loader's, which counts the batches it has handed out, saved with
``loader.state_dict()`` (``--position loader``). OUT.json gets ``{"losses": {step: loss}, "saved_at": step}``.
"""

import argparse
import json
import os
import signal
import time

import torch

import cerebras.pytorch as cstorch

TOTAL_BATCHES = 64


def batch(i):
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.01)  # (delivered at once; the sleep only gives the handler its turn)


class Batches:
    """A restartable loader of the fixed batches: its position is the batches handed out."""

    interrupt_at_draw = None  # the 0-based batch whose draw is interrupted

    def __init__(self, start=0):
        self.position = start

    def __iter__(self):
        while self.position < TOTAL_BATCHES:
            i = self.position
            if i == Batches.interrupt_at_draw:
                Batches.interrupt_at_draw = None
                ctrl_c()
            self.position += 1
            yield batch(i)

    def state_dict(self):
        cstorch.distributed.get_worker_state()  # (the protocol: called once per state_dict)
        return {"position": self.position}

    def load_state_dict(self, state_dict, strict=True):
        self.position = state_dict["position"]

    def aggregate_state_dict(self, worker_states):
        return {"worker_0": worker_states[0]}

    def deaggregate_state_dict(self, aggregated_state_dict, strict=True):
        return aggregated_state_dict["worker_0"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--interrupt-at", type=int, default=0)
    parser.add_argument("--where", default="body", choices=["body", "loader", "closure", "forward"])
    parser.add_argument("--wait-for", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--engine", default="jax", choices=["jax", "eager"])
    parser.add_argument("--position", default="loader", choices=["loader", "step"])
    args = parser.parse_args()
    # Ctrl-C raises KeyboardInterrupt, as in a terminal (a process started in the background
    # by a shell without job control inherits SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    torch.manual_seed(0)
    backend = cstorch.backend("CPU", engine=args.engine)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    compiled = cstorch.compile(model, backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start, state = 0, None
    if args.resume:
        state = cstorch.load(args.resume)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    loader = cstorch.utils.data.DataLoader(Batches, start)
    if state is not None and args.position == "loader":
        loader.load_state_dict(state["dataloader"])
    interrupt = args.interrupt_at if not args.wait_for else 0
    if interrupt and args.where == "loader":
        Batches.interrupt_at_draw = interrupt - 1
    losses, current = {}, {"step": start}

    def interrupting_forward(module, inputs):
        if interrupt and args.where == "forward" and current["step"] == interrupt:
            ctrl_c()

    model[2].register_forward_pre_hook(interrupting_forward)

    @cstorch.trace
    def training_step(x, y):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    @cstorch.step_closure
    def log(loss, step):
        losses[step] = loss.item()
        print(f"step {step}: loss {losses[step]:.6f}", flush=True)
        if interrupt and args.where == "closure" and step == interrupt:
            ctrl_c()

    def save(step):
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        if args.position == "loader":
            state["dataloader"] = loader.state_dict()
        cstorch.save(state, os.path.join(os.path.dirname(args.out), "interrupted.mdl"))

    saved_at = None
    executor = cstorch.utils.data.DataExecutor(loader, num_steps=args.steps - start)
    step = start
    try:
        for step, (x, y) in enumerate(executor, start=start + 1):
            current["step"] = step
            if step == args.interrupt_at and args.wait_for:
                print("waiting", flush=True)
                while not os.path.exists(args.wait_for):
                    time.sleep(0.01)
            if interrupt and args.where == "body" and step == interrupt:
                ctrl_c()
            loss = training_step(x, y)
            log(loss, step)
    except KeyboardInterrupt:  # the checkpoints page's pattern
        save(step)
        saved_at = step
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "saved_at": saved_at}, f)


if __name__ == "__main__":
    main()
