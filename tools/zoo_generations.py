"""Every generation of the real Cerebras Model Zoo, run unchanged on this project.

    python tools/zoo_generations.py MODELZOO_SRC [--lines 2.3,2.2] [--zoo-python PY]

``MODELZOO_SRC`` is a Model Zoo git repository (a checkout's top folder, or a bare git dir);
nothing is fetched. A plain (non-git) checkout of one release is used as it is, with
``--lines`` naming its line. For each release line (``RELEASE_LINES``: one tag per line) the tag is
checked out into a temporary folder, and for its fc_mnist and one transformer (gpt2 where the
release has it, else bert) the harness writes a tiny config from the shipped one (the zoo's
own fake-data options, 20 steps, checkpoints at 10 and 20) and runs the release's own
``run.py`` with its own command line, as a user of that release would:

* ``cpu``: train on CPU (and evaluate the trained model in the same process, where the
  release's command line can: ``--mode train_and_eval``);
* ``eager``: the same with ``CSTORCH_ENGINE=eager`` (every op as eager torch);
* ``csx``: train on CSX (this project's modeled wafer);
* ``eval``: evaluate from the last checkpoint of the ``cpu`` run;
* ``resume``: train from the first checkpoint of the ``cpu`` run to the end.

It prints one row per tag and model and writes the rows to ``artifacts/zoo_generations.json``.
The checks: CPU equals eager (step 1 exactly, every step within 1e-5 relative), CSX tracks
CPU within mixed-precision tolerance, eval from the checkpoint gives the in-process eval loss,
the resumed run continues the CPU run's curve (within 1e-5). Whether this project's cstorch
ran is recorded by ``tools/zoo_generations_site/sitecustomize.py`` (put first on the zoo
process's path; it notes which ``cerebras.pytorch``/``cstorch`` modules the process loaded).

A release line is an entry of ``RELEASE_LINES``: its tag, its models (where run.py and the
shipped config are, and how to make the config tiny) and its command line (``cli``). Lines
whose command line or logs differ plug in their own ``cli`` and ``losses``: the 1.x lines
(1.6 to 1.9) have their own command lines, and 1.8/1.9 two flows each (``1.9``: the cstorch
flow, ``runconfig.experimental_api``; ``1.9-runner``: the 1.x ``PyTorchBaseRunner``, on CSX
the appliance runner over the 1.x lazy API). Their CPU runs train only; fc_mnist's eval
from the checkpoint is checked against an eager-torch forward written here, gpt2's against
the eager engine's eval of the same checkpoint.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "tools" / "zoo_generations_site"
STUBS = ROOT / "tests" / "zoo" / "stubs"

STEPS = 20
FIRST_CHECKPOINT = 10
EAGER_TOLERANCE = 1e-5
CSX_TOLERANCE = 2e-2  # relative, CSX (half precision as shipped) against CPU
# A resumed run whose zoo restarts the data from the first batch is compared with the
# continuous run's first steps (same batches, weights 10 steps less trained) this closely.
RESTARTED_DATA_TOLERANCE = 1e-2
RUN_TIMEOUT = 900


@dataclasses.dataclass
class Settings:
    steps: int = STEPS
    checkpoint_steps: int = FIRST_CHECKPOINT
    batch_size: int = 4
    eval_steps: int = 5
    csx_eval: bool = False  # also evaluate the CSX run's last checkpoint on CSX (--csx-eval)


# ---------------------------------------------------------------------------------------------
# Config builders: the shipped params, made tiny, with the zoo's own fake-data options.


def _runconfig(params: dict, s: Settings) -> None:
    rc = params.setdefault("runconfig", {})
    rc.update(
        max_steps=s.steps,
        log_steps=1,
        checkpoint_steps=s.checkpoint_steps,
        save_initial_checkpoint=False,
        eval_steps=s.eval_steps,
        seed=1,
        eval_frequency=s.steps,
    )
    rc.pop("num_epochs", None)
    rc.pop("steps", None)


def fc_mnist_params(params: dict, s: Settings) -> dict:
    params = copy.deepcopy(params)
    for section in ("train_input", "eval_input"):
        params[section].update(use_fake_data=True, batch_size=s.batch_size)
    _runconfig(params, s)
    return params


def gpt2_params(params: dict, s: Settings) -> dict:
    """Two layers of width 32 on the zoo's DummyDataProcessor (128 tokens from a 32000-word
    vocabulary); dropout off so that engines with different random streams compare."""
    params = copy.deepcopy(params)
    for section in ("train_input", "eval_input"):
        inp = params[section]
        for key in ("data_dir", "prefetch_factor", "persistent_workers"):
            inp.pop(key, None)
        inp.update(
            data_processor="DummyDataProcessor",
            batch_size=s.batch_size,
            shuffle=False,
            shuffle_seed=1,
            num_workers=0,
        )
    model = params["model"]
    model.update(
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=2,
        filter_size=64,
        vocab_size=32000,
        max_position_embeddings=128,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    model.pop("embedding_dropout_rate", None)
    # Release_2.0's shipped gpt2_small schedule passes `alpha` to a Linear scheduler, which
    # cerebras-pytorch's strict scheduler configs (2.1 on; 2.1's configs dropped the key)
    # refuse; the tiny config leaves it out.
    schedule = params.get("optimizer", {}).get("learning_rate")
    for entry in schedule if isinstance(schedule, list) else [schedule]:
        if isinstance(entry, dict) and str(entry.get("scheduler", "")).lower() == "linear":
            entry.pop("alpha", None)
    _runconfig(params, s)
    return params


def float32(params: dict) -> dict:
    """The CPU runs' config: float32 (the CSX run keeps the shipped precision). The CPU
    engines are compared to 1e-5, which only float32 resolves: in bfloat16 eager torch's
    oneDNN kernels and XLA's may round a sum one unit apart."""
    params = copy.deepcopy(params)
    params["model"]["mixed_precision"] = False
    params["model"].pop("fp16_type", None)
    return params


# Release 2.4: its run.py takes the Trainer's YAML (``trainer: {init, fit, validate, ...}``);
# it ships no gpt2 config, so gpt2 starts from gpt3's Cerebras-GPT 111M (the same model
# class: 2.4's GPT3ModelConfig is GPT2ModelConfig under another name). Its fake-data
# processors cannot be named in that YAML (DummyDataProcessor and DummyIterableDataProcessor
# take GenericDataProcessorConfig, whose ``data_processor`` must read "GenericDataProcessor"),
# so gpt2 reads small HDF5 files the harness writes, through the shipped GptHDF5DataProcessor.


def gpt2_trainer_params(params: dict, s: Settings) -> dict:
    """The Trainer config of a tiny gpt2: the model of ``gpt2_params`` (2 layers of width 32,
    no dropout, 128 tokens from a 32000-word vocabulary); the shipped AdamW, gradient
    clipping and precision; the shipped two-phase linear schedule over 10 + 10 steps
    (warm-up, decay), so that the learning rate moves within the run. The loaders' data_dir
    is set by ``gpt2_trainer_data``."""
    params = copy.deepcopy(params)
    trainer = params["trainer"]
    init = trainer["init"]
    model = init["model"]
    model.update(
        name="gpt2",
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=2,
        filter_size=64,
        vocab_size=32000,
        max_position_embeddings=128,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        loss_weight=1 / 128,
    )
    for key in ("embedding_dropout_rate", "mixed_precision", "fp16_type"):  # deprecated
        model.pop(key, None)
    for entry in init.get("schedulers", []):
        for phase in next(iter(entry.values())).get("schedulers", []):
            next(iter(phase.values()))["total_iters"] = s.steps // 2
    init.update(
        seed=1,
        loop=dict(max_steps=s.steps, eval_frequency=s.steps, eval_steps=s.eval_steps),
        checkpoint=dict(steps=s.checkpoint_steps, save_initial_checkpoint=False),
        logging=dict(log_steps=1),
    )
    loader = dict(
        data_processor="GptHDF5DataProcessor",
        data_dir=None,
        max_sequence_length=128,
        batch_size=s.batch_size,
        shuffle=False,
        shuffle_seed=1,
        num_workers=0,
    )
    trainer["fit"] = dict(train_dataloader=dict(loader), val_dataloader=dict(loader))
    trainer["validate"] = dict(val_dataloader=dict(loader))
    trainer["validate_all"] = dict(val_dataloaders=dict(loader))
    return params


def gpt2_trainer_data(work: Path, params: dict) -> dict:
    """Writes the train and eval HDF5 files under ``work`` (enough examples for every step)
    and points the Trainer config's loaders at them."""
    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    import synthetic_data

    params = copy.deepcopy(params)
    trainer = params["trainer"]
    loader = trainer["fit"]["train_dataloader"]
    seq, vocab = loader["max_sequence_length"], trainer["init"]["model"]["vocab_size"]
    train, evals = (
        synthetic_data.write_gpt_hdf5(
            work / "data" / name, vocab, seq, examples=loader["batch_size"] * batches * 2, seed=seed
        )
        for name, seed, batches in (("train", 0, Settings.steps), ("eval", 1, Settings.eval_steps))
    )
    trainer["fit"]["train_dataloader"]["data_dir"] = train
    for section in (
        trainer["fit"]["val_dataloader"],
        trainer["validate"]["val_dataloader"],
        trainer["validate_all"]["val_dataloaders"],
    ):
        section["data_dir"] = evals
    return params


def float32_trainer(params: dict) -> dict:
    """``float32`` for a Trainer config: mixed precision off (gradient clipping kept)."""
    params = copy.deepcopy(params)
    params["trainer"]["init"].setdefault("precision", {})["enabled"] = False
    return params


# The 1.x lines (1.6 to 1.9): the same shipped configs, with what their runners need besides.


def fc_mnist_params_1x(params: dict, s: Settings) -> dict:
    """fc_mnist of 1.6-1.9 (depth 10, lr 0.001 as shipped) made to learn visibly in 20
    steps: 2 hidden layers of 16, batch 8, SGD lr 0.01 momentum 0.9, unshuffled fake data."""
    params = fc_mnist_params(params, s)
    for section in ("train_input", "eval_input"):
        params[section].update(batch_size=8, shuffle=False, to_float16=False)
    params["model"].update(depth=2, hidden_size=16, dropout=0.0, to_float16=False)
    params["optimizer"].update(optimizer_type="SGD", learning_rate=0.01, momentum=0.9)
    return params


def gpt2_params_1x(params: dict, s: Settings) -> dict:
    """gpt2 of 1.9 on its DummyDataProcessor. One loader worker: the 1.x data processors
    pass ``prefetch_factor=2`` even with no workers, which torch 2 refuses."""
    params = gpt2_params(params, s)
    for section in ("train_input", "eval_input"):
        params[section]["num_workers"] = 1
    return params


def gpt2_params_hdf5(params: dict, s: Settings) -> dict:
    """gpt2 of 1.6-1.8, which ship no fake data: their GptHDF5DataProcessor on small HDF5
    files the harness writes (``gpt2_hdf5_data``), 64 tokens from a 1024-word vocabulary."""
    params = gpt2_params_1x(params, s)
    for section in ("train_input", "eval_input"):
        params[section].update(data_processor="GptHDF5DataProcessor", max_sequence_length=64)
        if "vocab_size" in params[section]:  # 1.6 names it in its input sections too
            params[section]["vocab_size"] = 1024
    params["model"].update(vocab_size=1024, max_position_embeddings=64)
    return params


def gpt2_hdf5_data(work: Path, params: dict, per_example: bool = False) -> dict:
    """Writes the train and eval HDF5 files under ``work`` and points the config at them:
    enough examples for every step (the processor's iterable ends with its files).
    ``per_example``: 1.6's layout (one dataset per example)."""
    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    import synthetic_data

    params = copy.deepcopy(params)
    seq = params["train_input"]["max_sequence_length"]
    vocab = params["model"]["vocab_size"]
    for section, seed, batches in (
        ("train_input", 0, Settings.steps),
        ("eval_input", 1, Settings.eval_steps),
    ):
        examples = params[section]["batch_size"] * batches * 2
        params[section]["data_dir"] = synthetic_data.write_gpt_hdf5(
            work / "data" / section,
            vocab,
            seq,
            examples=examples,
            seed=seed,
            per_example=per_example,
        )
    return params


def float32_1x(params: dict) -> dict:
    """The CPU config of a 1.x transformer: float32, and bfloat16 off (the 1.9 gpt2 defaults
    ``use_bfloat16`` to True, which half-rounds even a float32 run's activations)."""
    params = float32(params)
    params["model"]["use_bfloat16"] = False
    return params


def flow(experimental_api: bool) -> Callable[[dict], dict]:
    """The runconfig of a 1.8/1.9 flow: ``experimental_api`` picks the cstorch flow
    (``run_cstorch_flow``) over the ``PyTorchBaseRunner`` one. 1.8's cstorch flow reads
    ``transfer_processes``, which neither its command line nor its shipped configs set."""

    def runconfig(params: dict) -> dict:
        params = copy.deepcopy(params)
        params["runconfig"].update(experimental_api=experimental_api, transfer_processes=None)
        return params

    return runconfig


def fc_mnist_reference_eval(checkpoint: str, params: dict) -> float:
    """The eval loss of a 1.x fc_mnist checkpoint, from eager torch written here: linear and
    relu per hidden layer, a last linear, log-softmax and NLL on one fake eval batch (the
    1.x fake data is zeros with label 0, every batch the same)."""
    sys.path[0:0] = [str(ROOT), str(ROOT / "compat")]
    import torch

    import cstorch

    state = cstorch.load(checkpoint)["model"]
    state = {k.removeprefix("model."): torch.as_tensor(v) for k, v in state.items()}
    x = torch.zeros(params["eval_input"]["batch_size"], 784)
    layer = 0
    while f"fc_layers.{layer}.weight" in state:
        x = torch.relu(x @ state[f"fc_layers.{layer}.weight"].T + state[f"fc_layers.{layer}.bias"])
        layer += 1
    logits = x @ state["last_layer.weight"].T + state["last_layer.bias"]
    return float(-torch.log_softmax(logits.double(), dim=1)[:, 0].mean())


# ---------------------------------------------------------------------------------------------
# Command lines.


def cli_2x(
    run_py: str, device: str, mode: str, params: str, model_dir: str, checkpoint: str | None
) -> list[str]:
    """2.0 to 2.10: ``python run.py {CPU,CSX} --mode M --params P --model_dir D``."""
    argv = [run_py, device, "--mode", mode, "--params", params, "--model_dir", model_dir]
    if checkpoint:
        argv += ["--checkpoint_path", checkpoint]
    return argv


def cli_18(
    run_py: str, device: str, mode: str, params: str, model_dir: str, checkpoint: str | None
) -> list[str]:
    """1.8: as 2.x, but CSX also names the execution strategy (``CSX weight_streaming``), and
    trains with ``python -O``: 1.8's cstorch flow asserts its parameters are XLA device tensors
    right after compiling (``p.device.type == "xla"``); the modeled wafer's are host tensors
    (``cpu``), and reporting "xla" would be false for every other torch check (measured:
    tests/zoo/GENERATIONS_1x.md). Only the cstorch flow's training asserts it: its eval, and
    the runner flow (``cli_18_runner``), run without ``-O``."""
    argv = cli_18_runner(run_py, device, mode, params, model_dir, checkpoint)
    return ["-O", *argv] if device == "CSX" and mode == "train" else argv


def cli_18_runner(
    run_py: str, device: str, mode: str, params: str, model_dir: str, checkpoint: str | None
) -> list[str]:
    """1.8 through its runner (``PyTorchBaseRunner``): the 1.8 command line, plain ``python``."""
    argv = cli_2x(run_py, device, mode, params, model_dir, checkpoint)
    if device == "CSX":
        argv = [argv[0], "CSX", "weight_streaming", *argv[2:]]
        if mode == "eval":
            # 1.8's cstorch flow evaluates from the checkpoint's step up to max_steps (the
            # training run's): an eval of the last checkpoint needs max_steps beyond it
            argv += ["--max_steps", str(Settings.steps + Settings.eval_steps)]
    return argv


def cli_17(
    run_py: str, device: str, mode: str, params: str, model_dir: str, checkpoint: str | None
) -> list[str]:
    """1.6 and 1.7: no device word: CPU by default, ``--appliance`` for the appliance (weight
    streaming on CSX)."""
    argv = [
        run_py,
        *(["--appliance"] if device == "CSX" else []),
        "--params",
        params,
        "--mode",
        mode,
        "--model_dir",
        model_dir,
    ]
    if checkpoint:
        argv += ["--checkpoint_path", checkpoint]
    return argv


# The zoo's note that a checkpoint holds no dataloader state (a resumed run sees the first
# batches again, as on the reference: only its restartable loaders are checkpointed).
_DATA_RESTARTED = re.compile(r"yield samples from the beginning")
_STEP_LOSS = re.compile(r"Step=(\d+), Loss=([-+0-9.eEnaif]+)")
_EVAL_LOSS = re.compile(r"Avg Eval Loss: ([-+0-9.eEnaif]+)")


def losses_2x(model_dir: Path, log: str) -> tuple[dict[int, float], float | None]:
    """Train losses by step and the final eval loss: the zoo's TensorBoard events (float32
    values) where it wrote them, else its log lines (5 decimals)."""
    train, evals = {}, []
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:  # read the logs instead
        EventAccumulator = None
    if EventAccumulator is not None:
        for path in sorted(
            glob.glob(str(model_dir / "**" / "events.out.tfevents*"), recursive=True)
        ):
            acc = EventAccumulator(path, size_guidance={"scalars": 0})
            acc.Reload()
            for tag in acc.Tags().get("scalars", []):
                events = acc.Scalars(tag)
                if tag in ("loss", "train/loss"):
                    train.update({e.step: e.value for e in events})
                elif tag.endswith("loss"):  # eval/loss, validate_0/loss, ...
                    evals += [e.value for e in events]
    if not train:
        train = {
            int(m[1]): float(m[2])
            for m in _STEP_LOSS.finditer(log)
            if "Eval" not in log[max(0, m.start() - 40) : m.start()]
        }
    if not evals:
        evals = [float(m[1]) for m in _EVAL_LOSS.finditer(log)]
    return train, (evals[-1] if evals else None)


# 1.8's runner ends its eval with "Avg Eval. Loss = <value>" (1.6, 1.7 and 1.9 as 2.x does).
_EVAL_LOSS_1X = re.compile(r"Avg Eval\.? Loss(?::| =) ([-+0-9.eEnaif]+)")


def losses_1x(model_dir: Path, log: str) -> tuple[dict[int, float], float | None]:
    """As ``losses_2x``, reading also the 1.x runners' forms of the eval summary line."""
    train, eval_loss = losses_2x(model_dir, log)
    if eval_loss is None:
        found = _EVAL_LOSS_1X.findall(log)
        eval_loss = float(found[-1]) if found else None
    return train, eval_loss


def checkpoints_2x(model_dir: Path) -> dict[int, str]:
    found = {}
    for path in glob.glob(str(model_dir / "checkpoint_*.mdl")):
        m = re.search(r"checkpoint_(\d+)\.mdl$", path)
        if m:
            found[int(m[1])] = path
    return dict(sorted(found.items()))


# ---------------------------------------------------------------------------------------------
# The table of release lines.


@dataclasses.dataclass
class Model:
    name: str
    run_py: str  # relative to the checkout
    config: str  # the shipped config it starts from, relative to the checkout
    build: Callable[[dict, Settings], dict]
    cpu_params: Callable[[dict], dict] = float32  # the CPU runs' precision
    # writes the data the config reads under the run's folder, where the zoo has no fake data
    data: Callable[[Path, dict], dict] | None = None
    # an independent eval loss of a checkpoint (eager torch written here), where there is one
    reference_eval: Callable[[str, dict], float] | None = None


@dataclasses.dataclass
class ReleaseLine:
    line: str
    tag: str
    models: list[Model]
    cli: Callable = cli_2x
    losses: Callable = losses_2x
    checkpoints: Callable = checkpoints_2x
    # --mode for the CPU run: "train_and_eval" evaluates the trained model in the same
    # process; "train" where the release's CPU train_and_eval runs training and eval as
    # separate processes (2.0/2.1: "sideband"), and the checkpoint's eval is then checked
    # against the same eval on the eager engine
    cpu_mode: str = "train_and_eval"
    runconfig: Callable[[dict], dict] | None = None  # the line's own runconfig keys (1.x flows)


def _src_2x(prefix: str, gpt2_dir: str) -> list[Model]:
    return [
        Model(
            "fc_mnist",
            f"{prefix}/fc_mnist/pytorch/run.py",
            f"{prefix}/fc_mnist/pytorch/configs/params.yaml",
            fc_mnist_params,
        ),
        Model(
            "gpt2", f"{gpt2_dir}/run.py", f"{gpt2_dir}/configs/params_gpt2_small.yaml", gpt2_params
        ),
    ]


def _src_1x(fake_gpt2_data: bool, hdf5_per_example: bool = False) -> list[Model]:
    """fc_mnist and gpt2 of a 1.x line; gpt2 on the zoo's DummyDataProcessor (1.9) or on
    HDF5 files the harness writes (1.6-1.8; 1.6 reads one dataset per example)."""
    gpt2_dir = "modelzoo/transformers/pytorch/gpt2"
    gpt2 = Model(
        "gpt2",
        f"{gpt2_dir}/run.py",
        f"{gpt2_dir}/configs/params_gpt2_small.yaml",
        gpt2_params_1x,
        cpu_params=float32_1x,
    )
    if not fake_gpt2_data:
        gpt2 = dataclasses.replace(
            gpt2,
            build=gpt2_params_hdf5,
            data=functools.partial(gpt2_hdf5_data, per_example=hdf5_per_example),
        )
    return [
        Model(
            "fc_mnist",
            "modelzoo/fc_mnist/pytorch/run.py",
            "modelzoo/fc_mnist/pytorch/configs/params.yaml",
            fc_mnist_params_1x,
            reference_eval=fc_mnist_reference_eval,
        ),
        gpt2,
    ]


_SRC_22 = "src/cerebras/modelzoo"
RELEASE_LINES: list[ReleaseLine] = [
    # 2.4 ships no fc_mnist and no gpt2 config: gpt2 from gpt3's 111M Trainer config
    ReleaseLine(
        "2.4",
        "Release_2.4.3",
        [
            Model(
                "gpt2",
                f"{_SRC_22}/models/nlp/gpt2/run.py",
                f"{_SRC_22}/models/nlp/gpt3/configs/Cerebras_GPT/111m.yaml",
                gpt2_trainer_params,
                cpu_params=float32_trainer,
                data=gpt2_trainer_data,
            )
        ],
    ),
    ReleaseLine("2.3", "Release_2.3.1", _src_2x(_SRC_22, f"{_SRC_22}/models/nlp/gpt2")),
    ReleaseLine("2.2", "Release_2.2.1", _src_2x(_SRC_22, f"{_SRC_22}/models/nlp/gpt2")),
    ReleaseLine(
        "2.1",
        "Release_2.1.1",
        _src_2x("modelzoo", "modelzoo/transformers/pytorch/gpt2"),
        cpu_mode="train",
    ),
    ReleaseLine(
        "2.0",
        "Release_2.0.3",
        _src_2x("modelzoo", "modelzoo/transformers/pytorch/gpt2"),
        cpu_mode="train",
    ),
    # 1.8 and 1.9 have two flows: cstorch (``runconfig.experimental_api``) and the
    # PyTorchBaseRunner (on CSX the appliance runner over the 1.x lazy API); 1.6 and 1.7 have
    # only the runner. Their CPU runs train only (eval from the checkpoint is checked against
    # eager torch).
    ReleaseLine(
        "1.9",
        "Release_1.9.1",
        _src_1x(True),
        losses=losses_1x,
        cpu_mode="train",
        runconfig=flow(True),
    ),
    ReleaseLine(
        "1.9-runner",
        "Release_1.9.1",
        _src_1x(True),
        losses=losses_1x,
        cpu_mode="train",
        runconfig=flow(False),
    ),
    ReleaseLine(
        "1.8",
        "Release_1.8.0",
        _src_1x(False),
        cli=cli_18,
        losses=losses_1x,
        cpu_mode="train",
        runconfig=flow(True),
    ),
    ReleaseLine(
        "1.8-runner",
        "Release_1.8.0",
        _src_1x(False),
        cli=cli_18_runner,
        losses=losses_1x,
        cpu_mode="train",
        runconfig=flow(False),
    ),
    ReleaseLine("1.7", "R_1.7.1", _src_1x(False), cli=cli_17, losses=losses_1x, cpu_mode="train"),
    ReleaseLine(
        "1.6",
        "R_1.6.1",
        _src_1x(False, hdf5_per_example=True),
        cli=cli_17,
        losses=losses_1x,
        cpu_mode="train",
    ),
    # 1.6's first release too: both 1.6 releases import PyTorch/XLA pieces on a CS system,
    # which the 1.x lazy API serves during the run (cerebras_pytorch.lazy.xla_pieces)
    ReleaseLine(
        "1.6.0",
        "R_1.6.0",
        _src_1x(False, hdf5_per_example=True),
        cli=cli_17,
        losses=losses_1x,
        cpu_mode="train",
    ),
]


# ---------------------------------------------------------------------------------------------
# Checkout: a tag's files from a git repository, without a work tree.


def git_dir(src: Path, required: bool = True) -> Path | None:
    for candidate in (src / ".git", src):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    if not required:
        return None
    raise SystemExit(
        f"{src} is not a git repository (a Model Zoo clone or bare git dir): the "
        "harness checks each release tag out of it."
    )


def checkout(gitdir: Path, tag: str, dest: Path) -> list[str]:
    """Writes the files of ``tag`` under ``dest``; returns the paths whose content the
    repository lacks (a partial mirror: large data files), which are skipped."""
    listing = subprocess.run(
        ["git", "--git-dir", str(gitdir), "ls-tree", "-r", "-z", tag],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    blobs = []
    for entry in filter(None, listing):
        meta, path = entry.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob":
            blobs.append((mode, sha, os.fsdecode(path)))
    missing = []
    cat = subprocess.Popen(
        ["git", "--git-dir", str(gitdir), "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        for mode, sha, path in blobs:
            if ".." in Path(path).parts or Path(path).is_absolute():
                raise SystemExit(f"refusing path {path!r} in {tag}")
            cat.stdin.write(sha + b"\n")
            cat.stdin.flush()
            header = cat.stdout.readline().split()
            if header[-1] == b"missing":
                missing.append(path)
                continue
            data = cat.stdout.read(int(header[2]))
            cat.stdout.read(1)
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if mode == b"120000":
                os.symlink(os.fsdecode(data), target)
            else:
                target.write_bytes(data)
                if mode == b"100755":
                    target.chmod(0o755)
    finally:
        cat.stdin.close()
        cat.wait()
        cat.stdout.close()
    return missing


# ---------------------------------------------------------------------------------------------
# Running and judging.


def first_error(log: str) -> str | None:
    """The innermost ``file:line`` and the exception line of the first traceback in ``log``
    (the root cause, where exceptions were chained)."""
    at = log.find("Traceback (most recent call last)")
    if at < 0:
        return None
    frames, message = [], ""
    for line in log[at:].splitlines()[1:]:
        if line.strip().startswith('File "'):
            frames.append(line)
        elif line and not line.startswith(" "):  # the exception line ends the traceback
            message = line.strip()
            break
    where = ""
    if frames:
        m = re.search(r'File "([^"]+)", line (\d+)', frames[-1])
        if m:
            where = f"{Path(m[1]).name}:{m[2]}: "
    return (where + message)[:300]


def zoo_environment(zoo_python: str, probe: Path, engine: str | None) -> dict:
    paths = [str(SITE), str(ROOT), str(ROOT / "compat")]
    has_torchvision = (
        subprocess.run([zoo_python, "-c", "import torchvision"], capture_output=True).returncode
        == 0
    )
    if not has_torchvision:
        paths.append(str(STUBS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "ZOO_GENERATIONS_PROBE": str(probe)}
    env.pop("CSTORCH_ENGINE", None)
    if engine:
        env["CSTORCH_ENGINE"] = engine
    return env


def run_one(
    zoo_python: str,
    checkout_dir: Path,
    work: Path,
    line: ReleaseLine,
    model: Model,
    kind: str,
    device: str,
    mode: str,
    checkpoint: str | None,
) -> dict:
    model_dir = work / f"model_dir_{kind}"
    shutil.rmtree(model_dir, ignore_errors=True)
    probe = work / f"probe_{kind}.json"
    probe.unlink(missing_ok=True)
    params = work / ("params_csx.yaml" if device == "CSX" else "params.yaml")
    argv = line.cli(
        str(checkout_dir / model.run_py), device, mode, str(params), str(model_dir), checkpoint
    )
    env = zoo_environment(zoo_python, probe, "eager" if kind.endswith("eager") else None)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [zoo_python] + argv,
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        log, rc = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {RUN_TIMEOUT}s", -1
    seconds = time.monotonic() - start
    (work / f"{kind}.log").write_text(log)
    train, eval_loss = line.losses(model_dir, log)
    ran = json.loads(probe.read_text()) if probe.exists() else {}
    return dict(
        kind=kind,
        rc=rc,
        seconds=round(seconds, 1),
        losses=train,
        eval_loss=eval_loss,
        data_restarted=bool(_DATA_RESTARTED.search(log)),
        checkpoints=line.checkpoints(model_dir),
        error=first_error(log) if rc else None,
        project_cstorch=bool(ran.get("project_cstorch")),
        engine=ran.get("engine"),
        from_tests=ran.get("from_tests"),
        torch_xla=ran.get("torch_xla"),
        log=str(work / f"{kind}.log"),
    )


def _relative(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-12)


def compare(a: dict[int, float], b: dict[int, float]) -> tuple[float, bool] | None:
    """Largest relative difference over the steps both have, and whether step 1's
    losses are identical; None where they share no step."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return max(_relative(a[s], b[s]) for s in common), a.get(1) == b.get(1)


def _same_batches(res: dict, cpu: dict, settings: Settings) -> float:
    first = settings.checkpoint_steps
    diff = compare(
        {s - first: v for s, v in res["losses"].items()},
        {s: v for s, v in cpu["losses"].items() if s <= first},
    )
    return diff[0] if diff else math.inf


def _restarted_data(res: dict, cpu: dict, settings: Settings, continuation: float) -> bool:
    """Whether the resumed run saw the first batches again: the zoo says so (2.0-2.2), or
    its losses are nearer the continuous run's on the first batches than on the later ones
    (the 2.3 Trainer restarts a dataloader that is not restartable without a message)."""
    return bool(res.get("data_restarted")) or _same_batches(res, cpu, settings) < continuation


def judge(runs: dict[str, dict], settings: Settings) -> dict:
    cpu, eager, csx, ev, res = (runs.get(k) for k in ("cpu", "eager", "csx", "eval", "resume"))
    verdict = {}

    def ok_train(run):
        return run is not None and run["rc"] == 0 and len(run["losses"]) >= settings.steps

    verdict["cpu"] = "ok" if ok_train(cpu) else "FAIL"
    verdict["csx"] = "ok" if ok_train(csx) else "FAIL"
    if ok_train(cpu) and ok_train(eager):
        diff, first_same = compare(cpu["losses"], eager["losses"])
        verdict["vs_eager"] = (
            ("ok" if first_same and diff <= EAGER_TOLERANCE else "FAIL")
            + f" {diff:.1e}"
            + ("" if first_same else " (step 1 differs)")
        )
    else:
        verdict["vs_eager"] = "FAIL"
    if ok_train(cpu) and ok_train(csx):
        diff, _ = compare(csx["losses"], cpu["losses"])
        verdict["csx"] = ("ok" if diff <= CSX_TOLERANCE else "FAIL") + f" {diff:.1e}"
    if ev is not None and ev["rc"] == 0 and ev["eval_loss"] is not None:
        reference = ev.get("reference")
        if reference is None and cpu:
            reference = cpu["eval_loss"]
        if reference is None and runs.get("eval_eager"):
            reference = runs["eval_eager"]["eval_loss"]
        if reference is None:
            verdict["eval"] = f"ran {ev['eval_loss']:.5f} (no in-process eval to compare)"
        else:
            d = _relative(ev["eval_loss"], reference)
            on_csx = ev.get("from") == "csx"  # mixed precision against the float64 forward
            verdict["eval"] = (
                ("ok" if d <= (CSX_TOLERANCE if on_csx else EAGER_TOLERANCE) else "FAIL")
                + f" {d:.1e}"
                + (" (CSX)" if on_csx else "")
            )
    else:
        verdict["eval"] = "FAIL"
    base = runs.get(res.get("from", "cpu")) if res else None  # the run it resumes
    if res is not None and res["rc"] == 0 and ok_train(base):
        cpu = base
        later = {s: v for s, v in cpu["losses"].items() if s > settings.checkpoint_steps}
        resumed = compare(res["losses"], later)
        starts = min(res["losses"], default=None)
        if resumed is None or starts != settings.checkpoint_steps + 1:
            verdict["resume"] = f"FAIL (resumed steps {sorted(res['losses'])[:3]}...)"
        elif resumed[0] > EAGER_TOLERANCE and _restarted_data(res, cpu, settings, resumed[0]):
            # Steps 11-20 of the resumed run see the batches of steps 1-10 again: compared
            # with those steps of the continuous run (10 steps less trained, same batches).
            diff = _same_batches(res, cpu, settings)
            verdict["resume"] = (
                "ok" if diff <= RESTARTED_DATA_TOLERANCE else "FAIL"
            ) + f" {diff:.1e} (data restarts)"
        else:
            verdict["resume"] = (
                ("ok" if resumed[0] <= EAGER_TOLERANCE else "FAIL")
                + f" {resumed[0]:.1e}"
                + (" (CSX)" if base is csx else "")
            )
    else:
        verdict["resume"] = "FAIL"
    if "eval_csx" in runs:
        verdict["csx_eval"] = _judge_csx_eval(runs["eval_csx"], runs.get("eval_csx_reference"))
    verdict["project_cstorch"] = all(r["project_cstorch"] for r in runs.values() if r)
    verdict["stand_ins"] = _stand_ins(runs)
    xla = sorted({str(r["torch_xla"]) for r in runs.values() if r and r.get("torch_xla")})
    if xla:
        verdict["torch_xla"] = ", ".join(xla)
    errors = [f"{k}: {r['error']}" for k, r in runs.items() if r and r["error"]]
    verdict["first_error"] = errors[0] if errors else ""
    return verdict


def _stand_ins(runs: dict) -> str:
    """The packages of this project's ``tests/`` folder the zoo's processes loaded (the
    ``tests/zoo/stubs`` stand-ins): "none", or "?" for runs recorded before the probe
    reported them."""
    probed = [r["from_tests"] for r in runs.values() if r and r.get("from_tests") is not None]
    if not probed:
        return "?"
    names = sorted({name.split(".")[0] for found in probed for name in found})
    return ", ".join(names) or "none"


def _judge_csx_eval(ev: dict, reference: dict | None) -> str:
    """Eval on CSX of the CSX run's checkpoint against the CPU eval of the same checkpoint
    (or an eager-torch forward written here), at CSX tolerance."""
    if ev["rc"] != 0 or ev["eval_loss"] is None:
        return "FAIL"
    ref = None if reference is None else reference.get("eval_loss", reference.get("value"))
    if ref is None:
        return f"ran {ev['eval_loss']:.5f} (nothing to compare)"
    d = _relative(ev["eval_loss"], ref)
    return ("ok" if d <= CSX_TOLERANCE else "FAIL") + f" {d:.1e}"


def _csx_eval(
    zoo_python: str,
    checkout_dir: Path,
    work: Path,
    line: ReleaseLine,
    model: Model,
    runs: dict,
    params: dict,
    cpu_params: dict,
) -> None:
    """``--csx-eval``: the CSX run's last checkpoint evaluated on CSX (``eval_csx``) and, as
    the reference, on CPU (``eval_csx_reference``; fc_mnist of 1.x: the eager forward)."""
    checkpoints = runs["csx"]["checkpoints"]
    if not checkpoints:
        return
    keep = work / "checkpoints_csx"
    keep.mkdir(exist_ok=True)
    last = shutil.copy(checkpoints[max(checkpoints)], keep)
    runs["eval_csx"] = run_one(
        zoo_python, checkout_dir, work, line, model, "eval_csx", "CSX", "eval", last
    )
    if model.reference_eval:
        runs["eval_csx_reference"] = dict(
            value=model.reference_eval(last, params),
            rc=0,
            losses={},
            project_cstorch=True,
            error=None,
        )
    else:
        runs["eval_csx_reference"] = run_one(
            zoo_python, checkout_dir, work, line, model, "eval_csx_reference", "CPU", "eval", last
        )


def run_model(
    zoo_python: str,
    checkout_dir: Path,
    work: Path,
    line: ReleaseLine,
    model: Model,
    settings: Settings,
) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    shipped = checkout_dir / model.config
    if not (checkout_dir / model.run_py).exists() or not shipped.exists():
        return dict(model=model.name, missing=f"{model.run_py} or {model.config} not in {line.tag}")
    params = model.build(yaml.safe_load(shipped.read_text()), settings)
    if line.runconfig:
        params = line.runconfig(params)
    if model.data:
        params = model.data(work, params)
    (work / "params_csx.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cpu_params = model.cpu_params(params)
    (work / "params.yaml").write_text(yaml.safe_dump(cpu_params, sort_keys=False))
    runs = {}
    start = time.monotonic()
    runs["cpu"] = run_one(
        zoo_python, checkout_dir, work, line, model, "cpu", "CPU", line.cpu_mode, None
    )
    runs["eager"] = run_one(
        zoo_python, checkout_dir, work, line, model, "eager", "CPU", line.cpu_mode, None
    )
    runs["csx"] = run_one(zoo_python, checkout_dir, work, line, model, "csx", "CSX", "train", None)
    # Evaluation and resumption read the CPU run's checkpoints; where the CPU run cannot
    # run at all (1.6's fc_mnist: outside the project), the CSX run's, on CSX.
    source, device = "cpu", "CPU"
    if not runs["cpu"]["checkpoints"] and runs["csx"]["checkpoints"]:
        source, device = "csx", "CSX"
    checkpoints = runs[source]["checkpoints"]
    if checkpoints:
        # copied first, as the runs start from clean model directories
        keep = work / "checkpoints"
        keep.mkdir(exist_ok=True)
        last = shutil.copy(checkpoints[max(checkpoints)], keep)
        runs["eval"] = run_one(
            zoo_python, checkout_dir, work, line, model, "eval", device, "eval", last
        )
        runs["eval"]["from"] = source
        if model.reference_eval:
            runs["eval"]["reference"] = model.reference_eval(
                last, cpu_params if source == "cpu" else params
            )
        if line.cpu_mode != "train_and_eval" and not model.reference_eval:
            runs["eval_eager"] = run_one(
                zoo_python, checkout_dir, work, line, model, "eval_eager", "CPU", "eval", last
            )
        first = checkpoints.get(settings.checkpoint_steps)
        if first:
            first = shutil.copy(first, keep)
            runs["resume"] = run_one(
                zoo_python, checkout_dir, work, line, model, "resume", device, "train", first
            )
            runs["resume"]["from"] = source
    if settings.csx_eval:
        _csx_eval(zoo_python, checkout_dir, work, line, model, runs, params, cpu_params)
    verdict = judge(runs, settings)
    return dict(
        model=model.name,
        seconds=round(time.monotonic() - start, 1),
        verdict=verdict,
        runs=runs,
        work=str(work),
    )


def _cell(row: dict, key: str) -> str:
    if "missing" in row:
        return "-"
    return str(row["verdict"].get(key, ""))


def print_table(rows: list[dict]) -> None:
    columns = ("cpu", "csx", "eval", "resume", "vs_eager", "project_cstorch", "stand_ins")
    if any("csx_eval" in row.get("verdict", {}) for row in rows):
        columns = columns[:3] + ("csx_eval",) + columns[3:]
    if any("torch_xla" in row.get("verdict", {}) for row in rows):
        columns += ("torch_xla",)
    header = ["line", "tag", "model", *columns, "s", "first error"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        cells = [
            row["line"],
            row["tag"],
            row["model"],
            *(_cell(row, c) for c in columns),
            str(row.get("seconds", "")),
            row.get("missing") or row.get("verdict", {}).get("first_error", ""),
        ]
        print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, nargs="?", help="a Model Zoo git clone or bare git dir")
    parser.add_argument("--lines", default="", help="release lines, e.g. 2.3,2.2 (default all)")
    parser.add_argument("--models", default="", help="e.g. fc_mnist (default all)")
    parser.add_argument("--zoo-python", default=os.environ.get("ZOO_PYTHON", sys.executable))
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where checkouts and runs go (default: a new temporary folder)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "zoo_generations.json")
    parser.add_argument(
        "--csx-eval",
        action="store_true",
        help="also evaluate the CSX run's last checkpoint on CSX, against "
        "the CPU eval of the same checkpoint",
    )
    parser.add_argument(
        "--rejudge",
        type=Path,
        nargs="*",
        default=None,
        help="judge the rows of earlier runs' JSON files again and print them",
    )
    args = parser.parse_args(argv)
    if args.rejudge is not None:
        rows = []
        for path in args.rejudge:
            for row in json.loads(path.read_text()):
                if "runs" in row:
                    runs = {
                        k: dict(r, losses={int(s): v for s, v in r["losses"].items()})
                        for k, r in row["runs"].items()
                    }
                    row["verdict"] = judge(runs, Settings())
                rows.append(row)
        print_table(rows)
        return 0

    if args.src is None:
        parser.error("give MODELZOO_SRC (a Model Zoo git clone or bare git dir)")
    gitdir = git_dir(args.src.resolve(), required=False)
    zoo_python = shutil.which(args.zoo_python) or args.zoo_python
    args.zoo_python = os.path.abspath(zoo_python)  # the runs change directory
    wanted = {x.strip() for x in args.lines.split(",") if x.strip()}
    unknown = wanted - {line.line for line in RELEASE_LINES}
    if unknown:
        parser.error(
            f"unknown release line(s) {sorted(unknown)}; known: "
            f"{[line.line for line in RELEASE_LINES]}"
        )
    if gitdir is None and len(wanted) != 1:
        parser.error(
            f"{args.src} is not a git repository: give a Model Zoo clone (or bare git "
            "dir) holding the release tags, or a plain checkout of one release with "
            "--lines naming its line (e.g. --lines 2.3)."
        )
    models = {x.strip() for x in args.models.split(",") if x.strip()}
    work_root = args.work_dir or Path(tempfile.mkdtemp(prefix="zoo_generations_"))
    settings = Settings(csx_eval=args.csx_eval)
    rows = []
    for line in RELEASE_LINES:
        if wanted and line.line not in wanted:
            continue
        checkout_dir = work_root / line.tag / "zoo"
        line_start = time.monotonic()
        if gitdir is None:  # a plain checkout of this one release, used as it is
            checkout_dir = args.src.resolve()
        elif not checkout_dir.exists():
            try:
                missing = checkout(gitdir, line.tag, checkout_dir)
            except subprocess.CalledProcessError:
                rows.append(
                    dict(
                        line=line.line,
                        tag=line.tag,
                        model="*",
                        missing=f"tag {line.tag} not in {gitdir}",
                    )
                )
                continue
            if missing:
                print(
                    f"{line.tag}: {len(missing)} file(s) absent from the repository, skipped "
                    f"(e.g. {missing[0]})",
                    file=sys.stderr,
                )
        for model in line.models:
            if models and model.name not in models:
                continue
            row = run_model(
                args.zoo_python,
                checkout_dir,
                work_root / line.line / model.name,
                line,
                model,
                settings,
            )
            rows.append(dict(line=line.line, tag=line.tag, **row))
            print_table(rows[-1:])
        print(f"{line.tag}: {time.monotonic() - line_start:.0f} s", file=sys.stderr)
    print()
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1, default=str))
    print(f"\nrows: {args.out}; runs under {work_root}")
    failed = any(
        "missing" not in r
        and any(
            str(r["verdict"].get(c, "")).startswith("FAIL")
            for c in ("cpu", "csx", "eval", "resume", "vs_eager", "csx_eval")
        )
        for r in rows
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
