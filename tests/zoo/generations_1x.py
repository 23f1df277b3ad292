"""Runs one 1.x Model Zoo release's own fc_mnist ``run.py`` through this project and checks
its numbers (issue 32; the measurements behind tests/zoo/GENERATIONS_1x.md).

    python tests/zoo/generations_1x.py ZOO_CHECKOUT [--zoo-python PY] [--work DIR]
           [--flow cstorch|runner]

ZOO_CHECKOUT is a release's source tree (the folder holding ``modelzoo/``). The zoo's files
are only read; every run is ``python modelzoo/fc_mnist/pytorch/run.py {CPU,CSX} --params
P --mode M --model_dir D [...]`` in that folder, with this project (its tree and ``compat``)
and ``tests/zoo/stubs`` on PYTHONPATH. Runs, each a separate process:

1.8's CSX command also names the execution strategy (``CSX weight_streaming``). The
1.6/1.7 command line has no device word: CPU is the default and ``--appliance`` runs
on the appliance (weight streaming), so CSX runs pass ``--appliance`` instead of ``CSX``.

1. train 20 steps on CPU (checkpoints at 10 and 20);
2. the same with ``CSTORCH_ENGINE=eager``: the CPU losses must equal it at step 1 and stay
   within 1e-5 (relative) at every step;
3. train 20 steps on CSX (the modeled wafer, mixed precision): within 2e-2 of CPU;
4. eval from checkpoint 20, on CPU from run 1's and on CSX from run 3's: equal (CPU 1e-6,
   CSX mixed precision) to an eager-torch forward with the checkpoint's weights on the same
   fake batch, computed here;
5. resume from checkpoint 10 (copied alone into a fresh model_dir, passed as
   ``--checkpoint_path``: 1.8's cstorch flow does not autoload) to step 20, on CPU
   and on CSX: its losses equal steps 11-20 of run 1 (CPU) or run 3 (CSX).

Losses are read from the TensorBoard ``loss`` scalars the zoo writes. Prints one JSON row.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = """\
train_input: {{data_dir: ./mnist, batch_size: 8, drop_last_batch: true, to_float16: false,
  shuffle: false, use_fake_data: true}}
eval_input: {{data_dir: ./mnist, batch_size: 8, drop_last_batch: true, shuffle: false,
  use_fake_data: true}}
model: {{name: fc_mnist, mixed_precision: false, depth: 2, hidden_size: 16, dropout: 0.0,
  activation_fn: relu, to_float16: false}}
optimizer: {{optimizer_type: SGD, learning_rate: 0.01, momentum: 0.9, loss_scaling_factor: 1.0}}
runconfig: {{max_steps: 20, log_steps: 1, checkpoint_steps: 10, seed: 1, save_losses: true,
  eval_steps: 5, transfer_processes: null, experimental_api: {experimental}}}
"""


def run_zoo(zoo, python, device, mode, model_dir, params, log, env_extra=None, args=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [ROOT, os.path.join(ROOT, "compat"), os.path.join(ROOT, "tests", "zoo", "stubs")])
    env.update(env_extra or {})
    script = "modelzoo/fc_mnist/pytorch/run.py"
    cli = os.path.join(zoo, "modelzoo/common/run_utils/cli_parser.py")
    if os.path.exists(cli):  # 1.8+: a device subcommand; 1.8's CSX also names the strategy
        where = [device]
        if device == "CSX" and "ExecutionStrategy.weight_streaming" in open(cli).read():
            where.append("weight_streaming")
    else:  # 1.6/1.7: CPU by default, --appliance for the weight-streaming appliance
        where = ["--appliance"] if device == "CSX" else []
    # 1.8's cstorch flow asserts its parameters are torch/XLA device tensors right after
    # compiling for the wafer; the modeled wafer keeps them as host tensors, so that one
    # check is skipped with -O (the zoo's code is unchanged; see GENERATIONS_1x.md).
    flags = ["-O"] if device == "CSX" and "weight_streaming" in where else []
    if flags and mode == "eval":
        # 1.8's cstorch eval counts its steps like training (from the checkpoint's step up
        # to max_steps): give it 5 steps beyond the checkpoint's 20.
        args = (*args, "--max_steps", "25")
    cmd = [python, *flags, script, *where, "--params", params, "--mode", mode,
           "--model_dir", model_dir, *args]
    start = time.time()
    with open(log, "w") as out:
        rc = subprocess.call(cmd, cwd=zoo, env=env, stdout=out, stderr=subprocess.STDOUT)
    return rc, time.time() - start, " ".join(cmd)


def losses(model_dir, sub):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = {}
    for path in sorted(glob.glob(os.path.join(model_dir, sub, "**", "events.*"),
                                 recursive=True)):
        acc = EventAccumulator(path)
        acc.Reload()
        for tag in ("loss", "avg_eval_loss"):
            if tag in acc.Tags()["scalars"]:
                for e in acc.Scalars(tag):
                    values[(tag, e.step)] = e.value
    return values


def first_error(log):
    text = open(log).read()
    hits = re.findall(r"^\w*(?:Error|Exception)\b.*$", text, re.M)
    return hits[-1][:200] if hits else None


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def reference_eval(checkpoint):
    """Eager torch, written here from the checkpoint's weights: fc_mnist's forward (linear +
    relu per hidden layer, a last linear, log-softmax, NLL) on one fake eval batch (zeros,
    labels 0; every fake batch is the same)."""
    sys.path[0:0] = [ROOT, os.path.join(ROOT, "compat")]
    import torch

    import cstorch

    state = cstorch.load(checkpoint)["model"]
    state = {k.split("model.", 1)[-1] if k.startswith("model.") else k: torch.as_tensor(v)
             for k, v in state.items()}
    x = torch.zeros(8, 784)
    layer = 0
    while f"fc_layers.{layer}.weight" in state:
        x = torch.relu(x @ state[f"fc_layers.{layer}.weight"].T
                       + state[f"fc_layers.{layer}.bias"])
        layer += 1
    logits = x @ state["last_layer.weight"].T + state["last_layer.bias"]
    log_probs = torch.log_softmax(logits, dim=1)
    return float(-log_probs[:, 0].mean())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("zoo")
    parser.add_argument("--zoo-python", default=sys.executable)
    parser.add_argument("--work", default=None)
    parser.add_argument("--flow", choices=("cstorch", "runner"), default="cstorch")
    a = parser.parse_args()
    zoo = os.path.abspath(a.zoo)
    work = a.work or os.path.join("/tmp", "gen1x_" + os.path.basename(zoo.rstrip("/")))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    params = os.path.join(work, "params.yaml")
    with open(params, "w") as f:
        f.write(CONFIG.format(experimental="true" if a.flow == "cstorch" else "false"))
    row = {"zoo": os.path.basename(zoo.rstrip("/")), "flow": a.flow, "commands": {},
           "seconds": {}, "errors": {}}
    py = os.path.abspath(a.zoo_python) if os.sep in a.zoo_python else a.zoo_python

    def go(name, device, mode, md, env=None, args=()):
        log = os.path.join(work, name + ".log")
        rc, secs, cmd = run_zoo(zoo, py, device, mode, md, params, log, env, args)
        row["commands"][name] = cmd + (" " + " ".join(f"{k}={v}" for k, v in env.items())
                                       if env else "")
        row["seconds"][name] = round(secs, 1)
        if rc != 0:
            row["errors"][name] = first_error(log) or f"exit {rc}"
        return rc == 0

    md = {k: os.path.join(work, k) for k in ("cpu", "eager", "csx")}
    go("cpu", "CPU", "train", md["cpu"])
    go("eager", "CPU", "train", md["eager"], env={"CSTORCH_ENGINE": "eager"})
    go("csx", "CSX", "train", md["csx"])
    cpu = {s: v for (t, s), v in losses(md["cpu"], "train").items() if t == "loss"}
    eager = {s: v for (t, s), v in losses(md["eager"], "train").items() if t == "loss"}
    csx = {s: v for (t, s), v in losses(md["csx"], "train").items() if t == "loss"}
    row["cpu_losses"] = [cpu[s] for s in sorted(cpu)]
    row["csx_losses"] = [csx[s] for s in sorted(csx)]
    if cpu and eager and sorted(cpu) == sorted(eager):
        row["vs_eager_step1_equal"] = cpu[min(cpu)] == eager[min(eager)]
        row["vs_eager_max_rel"] = max(rel(cpu[s], eager[s]) for s in cpu)
    if cpu and csx and sorted(cpu) == sorted(csx):
        row["csx_max_rel"] = max(rel(csx[s], cpu[s]) for s in cpu)
    for device, train_dir, tol_name in (("CPU", md["cpu"], ""), ("CSX", md["csx"], "_csx")):
        ckpts = sorted(glob.glob(os.path.join(train_dir, "checkpoint_*.mdl")))
        row["checkpoints" + tol_name] = [os.path.basename(c) for c in ckpts]
        curve = cpu if device == "CPU" else csx
        last = os.path.join(train_dir, "checkpoint_20.mdl")
        if os.path.exists(last):
            name = "eval" + tol_name
            if go(name, device, "eval", os.path.join(work, name),
                  args=("--checkpoint_path", last)):
                text = open(os.path.join(work, name + ".log")).read()
                found = re.findall(r"Avg Eval\.? Loss[:=]? *=? *([0-9.eE+-]+)", text)
                if found:
                    row[name + "_loss"] = float(found[-1])
                    row[name + "_reference"] = reference_eval(last)
                    row[name + "_rel"] = rel(row[name + "_loss"], row[name + "_reference"])
        first = os.path.join(train_dir, "checkpoint_10.mdl")
        if os.path.exists(first):
            name = "resume" + tol_name
            resume_dir = os.path.join(work, name)
            os.makedirs(resume_dir)
            shutil.copy(first, resume_dir)
            copied = os.path.join(resume_dir, os.path.basename(first))
            if go(name, device, "train", resume_dir, args=("--checkpoint_path", copied)):
                res = {s: v for (t, s), v in losses(resume_dir, "train").items()
                       if t == "loss"}
                row[name + "_steps"] = sorted(res)
                if res and all(s in curve for s in res):
                    row[name + "_max_rel"] = max(rel(res[s], curve[s]) for s in res)
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
