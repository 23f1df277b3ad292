"""Trains every model of a Cerebras Model Zoo checkout's registry a few steps on this project.

    python tools/zoo_sweep.py MODELZOO_SRC [--zoo-python PY] [--reference-python PY]
                              [--steps 3] [--models gpt3,llama] [--jobs 2] [--json OUT]

For each model of ``<src>/cerebras/modelzoo/registry/registry.yaml`` it takes a shipped
``trainer:`` config naming that model, shrinks it (2 layers, hidden size 32, ...; everything
else as shipped) and feeds it data the zoo makes itself (its dummy GPT data, fake MNIST), then
runs ``tests/zoo/sweep_worker.py``, each run in its own process:

* CPU: a ``Trainer`` built in Python, float32;
* CSX: the same on the modeled wafer with the config's own precision (e.g. cbfloat16 with
  dynamic loss scaling), which must update the weights and track the CPU float32 losses
  within 1e-2, or (with the reference) within the reference's own distance from float32 in
  that precision where its loss is more sensitive than that;
* YAML: the zoo's command line (``cszoo fit``) on the same config, CPU float32, which must
  give the CPU run's losses;
* with ``--reference-python`` (a Python with cerebras-pytorch 2.10): the CPU run on the
  reference, from the same initial weights (``torch.manual_seed``); "difference" is the
  largest relative difference of the per-step losses.

It prints one table: model, CPU, CSX, YAML, difference, first error (file:line). A model whose
data the sweep cannot make is listed with the reason. Fetches nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "zoo" / "sweep_worker.py"

# Model sizes: every key with one of these names, wherever it is in the model config.
SHRINK = {
    "hidden_size": 32,
    "d_model": 32,
    "embedding_size": 32,
    "num_hidden_layers": 2,
    "num_layers": 2,
    "encoder_num_hidden_layers": 2,
    "decoder_num_hidden_layers": 2,
    "num_encoder_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 2,
    "num_attention_heads": 2,
    "encoder_num_heads": 2,
    "decoder_num_heads": 2,
    "filter_size": 64,
    "intermediate_size": 64,
    "d_ff": 64,
    "d_kv": 16,
    "encoder_filter_size": 64,
    "decoder_filter_size": 64,
    "num_experts": 2,
    "num_kv_groups": 1,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "rotary_dim": 16,
    "dropout_rate": 0.0,
    "attention_dropout_rate": 0.0,
    "embedding_dropout_rate": 0.0,
    # every other dropout too: the engine draws its random masks differently by design
    "task_dropout": 0.0,
    "encoder_output_dropout_rate": 0.0,
    "relu_dropout_rate": 0.0,
    "embd_pdrop": 0.0,
    "stochastic_depth_drop_prob": 0.0,
}
SEQ, VOCAB = 128, 512  # the GPT-style sequences the sweep writes


def write_gpt_hdf5(data_dir: Path, sequences=16, seed=0) -> Path:
    """GPT training data in the zoo's HDF5 "sample" format: one file whose ``data`` is
    ``[N, 3, SEQ]`` int32 (input ids, loss mask, labels = ids shifted by one)."""
    import h5py
    import numpy as np

    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(sequences, SEQ + 1), dtype=np.int32)
    data = np.stack([tokens[:, :-1], np.ones((sequences, SEQ), np.int32), tokens[:, 1:]], axis=1)
    with h5py.File(data_dir / "data-0.h5", "w") as f:
        f.create_dataset("data", data=data)
        f.attrs["n_examples"] = sequences
    return data_dir


def write_mlm_hdf5(data_dir: Path, vocab: int, sequences=16, seed=0) -> Path:
    """Masked-LM data in the zoo's HDF5 "sample" format (BertHDF5DataProcessor): ``data``
    ``[N, 2, SEQ]`` (input ids, attention mask), ``labels`` ``[N, 1, SEQ]`` and a
    ``data_params.json`` saying the objective is MLM (labels at every position)."""
    import h5py
    import numpy as np

    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, size=(sequences, SEQ), dtype=np.int32)
    data = np.stack([ids, np.ones((sequences, SEQ), np.int32)], axis=1)
    labels = rng.integers(4, vocab, size=(sequences, 1, SEQ), dtype=np.int32)
    with h5py.File(data_dir / "data-0.h5", "w") as f:
        f.create_dataset("data", data=data)
        f.create_dataset("labels", data=labels)
        f.attrs["n_examples"] = sequences
    (data_dir / "data_params.json").write_text(
        json.dumps({"dataset": {"training_objective": "mlm", "mlm_with_gather": False}})
    )
    return data_dir


def _shrink(node):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in SHRINK and isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = type(value)(SHRINK[key]) if value else value
            else:
                out[key] = _shrink(value)
        if "top_k" in out and "num_experts" in out:
            out["top_k"] = min(out["top_k"], out["num_experts"])
        return out
    if isinstance(node, list):
        return [_shrink(v) for v in node]
    return node


DATA_PROCESSORS: dict = {}  # registry name -> data processor class names (set in main)
MODEL_PATHS: dict = {}  # registry name -> the model class's dotted path (set in main)


def _missing_module(name, src: Path):
    """The registry's module for ``name`` when the checkout does not have it, else None."""
    module = MODEL_PATHS.get(name, "").rsplit(".", 1)[0]
    base = src.joinpath(*module.split("."))
    if module and not base.with_suffix(".py").exists() and not (base / "__init__.py").exists():
        return module
    return None


def _first_phase(params):
    trainer = params.get("trainer")
    if isinstance(trainer, list):
        trainer = trainer[0].get("trainer", trainer[0])
    return trainer


def shipped_configs(src: Path) -> dict:
    """``{model name: [config paths]}`` for every ``trainer:`` YAML under models/."""
    found = {}
    for path in sorted((src / "cerebras" / "modelzoo" / "models").rglob("*.yaml")):
        try:
            params = yaml.safe_load(path.read_text())
            phase = _first_phase(params)
            name = phase["init"]["model"]["name"]
        except Exception:  # noqa: BLE001 - not a trainer config
            continue
        found.setdefault(name, []).append(path)
    return found


def _hidden(path):
    """The config's model width (the first ``hidden_size``/``d_model``, nested ones too)."""

    def first(node):
        if isinstance(node, dict):
            for key in ("hidden_size", "d_model"):
                if isinstance(node.get(key), int):
                    return node[key]
            node = list(node.values())
        if isinstance(node, list):
            return next((w for w in map(first, node) if w is not None), None)
        return None

    return first(_first_phase(yaml.safe_load(path.read_text()))["init"]["model"]) or 1 << 30


# Models without a shipped config of their own whose config class takes another model's
# config: generic_image_encoders is the class DINO's config instantiates.
BORROW = {"generic_image_encoders": "dino"}


def tiny_config(name, configs, processors, workdir: Path):
    """The tiny config for ``name`` and why none could be made (one of them is None)."""
    donor = BORROW.get(name, name)
    if donor not in configs:
        # No shipped config of its own: one of a model that reads the same data (gpt2 ->
        # gpt3), with this model's name.
        donor = next(
            (
                other
                for other, others_processors in DATA_PROCESSORS.items()
                if other in configs and others_processors == processors
            ),
            None,
        )
        if donor is None:
            return None, "no shipped trainer config names this model (or one with its data)"
    path = min(configs[donor], key=_hidden)
    phase = copy.deepcopy(_first_phase(yaml.safe_load(path.read_text())))
    init = phase["init"]
    init["model"]["name"] = name
    if donor != name and name not in BORROW:  # options the donor's config leaves at its defaults
        init["model"].setdefault("embedding_dropout_rate", 0.0)  # random masks differ
    init["model"] = _shrink(init["model"])
    for key in ("device", "backend", "schedulers", "checkpoint", "callbacks", "loggers", "logging"):
        init.pop(key, None)
    _drop_missing_layer_groups(init.get("optimizer"))
    init["seed"] = 1
    init["loop"] = {"num_steps": 3, "eval_frequency": None}
    train = phase.get("fit", {}).get("train_dataloader")
    try:
        phase["fit"] = {"train_dataloader": feed(name, init["model"], train, processors, workdir)}
    except NoData as reason:
        return None, str(reason)
    phase.pop("validate", None)
    phase.pop("validate_all", None)
    origin = path.relative_to(path.parents[3])
    return {"trainer": phase}, f"from {origin}" + (f" (of {donor})" if donor != name else "")


def _drop_missing_layer_groups(optimizer):
    """Leaves out optimizer parameter groups (YAML ``params``) that name only layers the
    shrunk model does not have (e.g. DINO's per-layer ``layers.5`` groups): the zoo refuses a
    group that matches no parameter."""
    import re

    for options in (optimizer or {}).values():
        groups = (options or {}).get("params") if isinstance(options, dict) else None
        if not isinstance(groups, list):
            continue

        def missing(group):
            layers = [re.search(r"layers\.(\d+)\.", p) for p in group.get("params", [])]
            return bool(layers) and all(
                m and int(m.group(1)) >= SHRINK["num_hidden_layers"] for m in layers
            )

        options["params"] = [g for g in groups if not (isinstance(g, dict) and missing(g))]


class NoData(Exception):
    """This sweep cannot make the data a model's processor reads (the message says why)."""


def _set_everywhere(node, key, value):
    """Sets ``key`` to ``value`` wherever it occurs in a nested config."""
    if isinstance(node, dict):
        for k in node:
            if k == key:
                node[k] = value
            else:
                _set_everywhere(node[k], key, value)
    elif isinstance(node, list):
        for v in node:
            _set_everywhere(v, key, value)


def _loader(train: dict, **changes) -> dict:
    """The shipped train loader with a small batch, no worker processes, a fixed shuffle
    seed (shuffling as shipped: both runs draw the same order) and ``changes``."""
    out = {k: v for k, v in train.items() if k != "use_worker_cache"}
    out.update(batch_size=2, num_workers=0)
    for key, value in (("prefetch_factor", None), ("persistent_workers", False)):
        if key in out:  # without workers torch's DataLoader takes only these
            out[key] = value
    if out.get("shuffle", True) and ("shuffle_seed" in out or out.get("data_processor") in SEEDED):
        out["shuffle_seed"] = 1
    out.update(changes)
    return out


# Processors with a shuffle_seed that shipped configs may leave unset (a random order).
SEEDED = {
    "BertCSVDynamicMaskDataProcessor",
    "BertCSVDataProcessor",
    "SST2DataProcessor",
    "MNLIDataProcessor",
    "BertSumCSVDataProcessor",
    "BertTokenClassifierDataProcessor",
    "DiffusionLatentImageNet1KProcessor",
    "DinoImageDataProcessor",
    "BaseImageDataProcessor",
    "ImageNet1KProcessor",
}
BERT_MSL = 64  # sequence length of the sweep's BERT-family text
BERT_TEXT = {
    "BertCSVDynamicMaskDataProcessor",
    "BertCSVDataProcessor",
    "SST2DataProcessor",
    "MNLIDataProcessor",
    "BertSumCSVDataProcessor",
    "BertTokenClassifierDataProcessor",
}


def feed(name, model: dict, train, processors, workdir: Path) -> dict:
    """Writes synthetic data for the processor the shipped config uses (or, when it names
    none, one the registry lists) and returns the train loader config reading it; sets the
    model's sizes to match (vocabulary, sequence length). Raises NoData when it cannot."""
    synthetic = _synthetic_data()
    used = train.get("data_processor") if isinstance(train, dict) else None
    data = workdir / "data"
    if "GptHDF5MapDataProcessor" in processors and used != "DpoHDF5DataProcessor":
        model["vocab_size"] = VOCAB
        if "max_position_embeddings" in model:
            model["max_position_embeddings"] = SEQ
        return {
            "data_processor": "GptHDF5MapDataProcessor",
            "batch_size": 2,
            "shuffle": False,
            "num_workers": 0,
            "data_dir": str(write_gpt_hdf5(data)),
        }
    if used == "BertHDF5DataProcessor":
        vocab = int(model.get("vocab_size") or VOCAB)
        if "max_position_embeddings" in model:
            model["max_position_embeddings"] = SEQ + 2  # ESM-2 counts two extra
        return _loader(train, shuffle=False, data_dir=str(write_mlm_hdf5(data, vocab)))
    if name == "fc_mnist" and train:
        return {**train, "use_fake_data": True, "fake_data_seed": 1, "batch_size": 4}
    if used in BERT_TEXT:
        # Shipped configs may leave dropouts at BERT's defaults (0.1): off, like the others.
        model.update(dropout_rate=0.0, attention_dropout_rate=0.0, embedding_dropout_rate=0.0)
    if used in ("BertCSVDynamicMaskDataProcessor", "BertCSVDataProcessor"):
        if used == "BertCSVDataProcessor":
            raise NoData("BertCSVDataProcessor (pre-masked CSV) has no writer here")
        vocab_file, vocab_size = synthetic.write_vocab(data / "vocab.txt", synthetic.BERT_SPECIALS)
        model["vocab_size"] = vocab_size
        model["max_position_embeddings"] = BERT_MSL
        return _loader(
            train,
            vocab_file=vocab_file,
            max_sequence_length=BERT_MSL,
            max_predictions_per_seq=10,
            data_dir=synthetic.write_bert_pretraining_csv(data / "csv", BERT_MSL),
        )
    if used in ("SST2DataProcessor", "MNLIDataProcessor"):
        vocab_file, vocab_size = synthetic.write_vocab(data / "vocab.txt", synthetic.BERT_SPECIALS)
        model["vocab_size"] = vocab_size
        model["max_position_embeddings"] = BERT_MSL
        task = "sst2" if used == "SST2DataProcessor" else "mnli"
        return _loader(
            train,
            vocab_file=vocab_file,
            max_sequence_length=BERT_MSL,
            data_dir=synthetic.write_glue_tsv(data / task, task),
        )
    if used == "BertSumCSVDataProcessor":
        vocab_file, vocab_size = synthetic.write_vocab(data / "vocab.txt", synthetic.BERT_SPECIALS)
        model.update(vocab_size=vocab_size, max_position_embeddings=BERT_MSL, vocab_file=vocab_file)
        return _loader(
            train,
            vocab_file=vocab_file,
            max_sequence_length=BERT_MSL,
            max_cls_tokens=8,
            data_dir=synthetic.write_bertsum_csv(data / "csv", vocab_size, BERT_MSL, 8),
        )
    if used == "BertTokenClassifierDataProcessor":
        vocab_file, vocab_size = synthetic.write_vocab(data / "vocab.txt", synthetic.BERT_SPECIALS)
        folder, labels, classes = synthetic.write_ner_csv(data / "csv", BERT_MSL)
        model.update(
            vocab_size=vocab_size,
            max_position_embeddings=BERT_MSL,
            label_vocab_file=labels,
            num_classes=classes,
        )
        return _loader(
            train,
            vocab_file=vocab_file,
            max_sequence_length=BERT_MSL,
            label_vocab_file=labels,
            data_dir=folder,
        )
    if used == "DpoHDF5DataProcessor":
        _set_everywhere(model, "vocab_size", VOCAB)
        _set_everywhere(model, "max_position_embeddings", SEQ)
        return _loader(train, data_dir=synthetic.write_dpo_hdf5(data, VOCAB, SEQ))
    if used == "DPRHDF5DataProcessor":
        _set_everywhere(model, "vocab_size", VOCAB)
        _set_everywhere(model, "max_position_embeddings", BERT_MSL)
        return _loader(train, data_dir=synthetic.write_dpr_hdf5(data, VOCAB, BERT_MSL))
    if used in ("T5DynamicDataProcessor", "TransformerDynamicDataProcessor"):
        vocab_file, vocab_size = synthetic.write_vocab(data / "vocab.txt", synthetic.T5_SPECIALS)
        src_len = BERT_MSL
        if used == "T5DynamicDataProcessor":
            tgt_len = _t5_target_length(src_len)
            folder = synthetic.write_t5_text(data / "text")
        else:
            tgt_len = src_len
            folder = synthetic.write_translation_text(data / "text", src_len)
        model["src_vocab_size"] = vocab_size
        if "tgt_vocab_size" in model:
            model["tgt_vocab_size"] = vocab_size
        model.update(src_max_position_embeddings=src_len, tgt_max_position_embeddings=tgt_len)
        return _loader(
            train,
            src_vocab_file=vocab_file,
            src_data_dir=folder,
            src_max_sequence_length=src_len,
            tgt_max_sequence_length=tgt_len,
            shuffle_buffer=16,
        )
    vision = {
        "ImageNet1KProcessor",
        "DiffusionLatentImageNet1KProcessor",
        "DinoImageDataProcessor",
        "BaseImageDataProcessor",
        "LlavaHDF5MapDataProcessor",
        "MultimodalSimpleHDF5MapDataProcessor",
    }
    if used in vision and not ZOO_HAS_TORCHVISION:
        raise NoData(f"{used} needs torchvision in the zoo Python (tests/zoo/README.md)")
    if used == "ImageNet1KProcessor":
        _set_everywhere(model, "image_size", [IMAGE, IMAGE])
        _set_everywhere(model, "patch_size", [IMAGE // 4, IMAGE // 4])
        shipped = int(_first_size(train.get("image_size")) or 224)
        return _loader(
            train,
            image_size=[IMAGE, IMAGE],
            transforms=_scale_sizes(train.get("transforms") or [], IMAGE / shipped),
            data_dir=synthetic.write_imagenet_folder(data / "imagenet"),
        )
    if used == "DiffusionLatentImageNet1KProcessor":
        latent = [8, 8]
        vae = model["vae"]
        vae["latent_size"] = latent
        channels = int(vae.get("latent_channels") or 4)
        folder = synthetic.write_latent_folder(data / "latents", [2 * channels, *latent])
        return _loader(
            train,
            data_dir=[folder],
            latent_size=latent,
            num_workers=None,  # its config takes only None or a positive count
            latent_channels=channels,
            num_diffusion_steps=model.get("num_diffusion_steps"),
            schedule_name=model.get("schedule_name"),
            vae_scaling_factor=vae.get("scaling_factor"),
            label_dropout_rate=model.get("label_dropout_rate"),
        )
    if used in ("DinoImageDataProcessor", "BaseImageDataProcessor"):
        return _feed_ssl(model, train, synthetic, data, processors)
    if used in ("LlavaHDF5MapDataProcessor", "MultimodalSimpleHDF5MapDataProcessor"):
        return _feed_multimodal(model, train, synthetic, data, used)
    raise NoData(f"needs {used or 'its'} data files; this sweep makes no fake data for it")


IMAGE = 32  # side of the sweep's (square) model images
HALF_ONLY = {"dit"}  # models that run only in mixed precision
REPLAY = {"dit"}  # data drawn with torch.randn in bfloat16 (changed after torch 2.4)
ZOO_HAS_TORCHVISION = False  # set in main: whether the zoo Python has a real torchvision


def _first_size(size):
    return size[0] if isinstance(size, (list, tuple)) else size


def _scale_sizes(transforms: list, factor: float) -> list:
    """Image transforms with every ``size`` scaled by ``factor`` (at least 1 pixel)."""

    def scaled(value):
        if isinstance(value, (list, tuple)):
            return [max(1, round(v * factor)) for v in value]
        return max(1, round(value * factor))

    return [{**t, "size": scaled(t["size"])} if "size" in t else dict(t) for t in transforms]


def _feed_ssl(model, train, synthetic, data, processors):
    """DINO-style self-supervised image data: an ImageNet folder seen through the shipped
    multi-crop transform, at 56-pixel global and 28-pixel local crops of 14-pixel patches
    (4x4 and 2x2 patches); heads and losses shrunk with the trunks."""
    patch, global_size, local_size = 14, 56, 28
    for trunk in model.get("image_model_trunks") or []:
        image = trunk["image_model"]
        image.update(image_size=[global_size, global_size], patch_size=[patch, patch])
        interpolate = image.get("interpolate_position_embedding")
        if isinstance(interpolate, dict) and "local_patch_dims" in interpolate:
            interpolate["local_patch_dims"] = [local_size // patch] * 2
    out_size = 64
    for head in model.get("heads") or []:
        head["head_model"].update(
            input_size=SHRINK["hidden_size"], output_size=out_size, bottleneck_size=16
        )
    for loss in model.get("losses") or []:
        if "input_size" in loss["loss"]:
            loss["loss"]["input_size"] = out_size
    transform = copy.deepcopy(train["ssl_transform"])
    crops = transform.get("multi_crop_transform") or {}
    if "global_image_size" in crops:
        crops.update(global_image_size=global_size, local_image_size=local_size)
    masked = transform.get("masked_patch_transform") or {}
    if "image_size" in masked:
        masked.update(image_size=global_size, patch_size=patch)
    processor = train["data_processor"]
    if processor not in processors and len(processors) == 1:
        processor = next(iter(processors))  # a borrowed config: this model's own processor
    return _loader(
        train,
        data_processor=processor,
        ssl_transform=transform,
        persistent_workers=False,
        prefetch_factor=None,
        dataset={
            "name": "Imagenet",
            "split": "train",
            "root": synthetic.write_imagenet_folder(data / "imagenet", size=(64, 64)),
        },
    )


MM_SEQ = 32  # text length of the multimodal samples


def _feed_multimodal(model, train, synthetic, data, used):
    """LLaVA-style data: HDF5 text samples with one image each (28-pixel images of 14-pixel
    patches: 4 image tokens after the first text token)."""
    patch, side = 14, 28
    tokens = (side // patch) ** 2
    _set_everywhere(model, "image_size", [side, side])
    _set_everywhere(model, "patch_size", [patch, patch])
    _set_everywhere(model, "input_unit", SHRINK["hidden_size"])
    _fix_units(model)
    text = model["text_model"]
    text.update(vocab_size=VOCAB, max_position_embeddings=MM_SEQ)
    shipped = int((train.get("image_data_size") or [3, 336, 336])[-1])
    writer = (
        synthetic.write_llava_hdf5
        if used == "LlavaHDF5MapDataProcessor"
        else synthetic.write_multimodal_simple_hdf5
    )
    folder = writer(
        data / "h5",
        data / "images",
        VOCAB,
        MM_SEQ,
        tokens,
        image_start=int(model.get("image_start_idx", 1)),
    )
    extra = {"num_patches": tokens} if used != "LlavaHDF5MapDataProcessor" else {}
    return _loader(
        train,
        data_dir=folder,
        img_data_dir=str(data / "images"),
        image_data_size=[3, side, side],
        transforms=_scale_sizes(train.get("transforms") or [], side / shipped),
        **extra,
    )


def _fix_units(node):
    """Projector layers (``layers_units``): every layer of the hidden size."""
    if isinstance(node, dict):
        if isinstance(node.get("layers_units"), list):
            node["layers_units"] = [SHRINK["hidden_size"]] * len(node["layers_units"])
        for value in node.values():
            _fix_units(value)
    elif isinstance(node, list):
        for value in node:
            _fix_units(value)


def _t5_target_length(src_len, corruption=0.15, span=3):
    """The decoder length T5's span corruption needs for encoder inputs of ``src_len``
    (the raw chunk grows until its corrupted form fills ``src_len``)."""

    def lengths(raw):
        noise = int(round(raw * corruption))
        spans = int(round(noise / span))
        return raw - noise + spans + 1, noise + spans + 1

    raw = src_len
    while lengths(raw)[0] < src_len:
        raw += 1
    return lengths(raw)[1]


def _synthetic_data():
    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    try:
        import synthetic_data
    finally:
        sys.path.pop(0)
    return synthetic_data


STUBS = ROOT / "tests" / "zoo" / "stubs"
EVAL_HARNESS_STUBS = ("lm_eval", "bigcode_eval", "_eval_harness_standin.py")


def _reference_stubs() -> str:
    """A folder with only the eval-harness stand-ins (the reference has torchvision)."""
    folder = Path(tempfile.gettempdir()) / "zoo_sweep_reference_stubs"
    folder.mkdir(exist_ok=True)
    for name in EVAL_HARNESS_STUBS:
        link = folder / name
        if not link.exists():
            link.symlink_to(STUBS / name)
    return str(folder)


def _env(src, ours: bool):
    paths = [str(src)]
    if ours:
        # With a real torchvision the zoo Python needs only the eval-harness stand-ins.
        paths += [
            str(ROOT),
            str(ROOT / "compat"),
            _reference_stubs() if ZOO_HAS_TORCHVISION else str(STUBS),
        ]
    else:
        paths.append(_reference_stubs())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    env.pop("CSTORCH_ENGINE", None)
    return env


def run_worker(python, src, ours, config, how, device, precision, steps, workdir, *extra, tag=""):
    out = workdir / f"{how}_{device}_{precision}_{'ours' if ours else 'ref'}{tag}.json"
    model_dir = workdir / out.stem
    cmd = [
        python,
        str(WORKER),
        "--config",
        str(config),
        "--how",
        how,
        "--device",
        device,
        "--precision",
        precision,
        "--steps",
        str(steps),
        "--model-dir",
        str(model_dir),
        "--out",
        str(out),
        *extra,
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=workdir, env=_env(src, ours), capture_output=True, text=True, timeout=1800
        )
    except subprocess.TimeoutExpired:
        return {"losses": [], "error": {"type": "Timeout", "message": "30 min", "where": "?"}}
    (workdir / f"{out.stem}.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
    if not out.exists():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            "losses": [],
            "error": {"type": "Crash", "message": last[:300], "where": f"exit {proc.returncode}"},
        }
    return json.loads(out.read_text())


def _rel(a, b):
    if len(a) != len(b) or not a:
        return math.inf
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def _ok(result, steps):
    losses = result.get("losses") or []
    return (
        result.get("error") is None
        and len(losses) == steps
        and all(math.isfinite(x) for x in losses)
    )


def _short_where(where: str, src: Path) -> str:
    for base in (str(src) + os.sep, str(ROOT) + os.sep):
        where = where.replace(base, "")
    return where.replace(os.path.expanduser("~"), "~")


def sweep_model(name, processors, configs, args, src):
    workdir = Path(tempfile.mkdtemp(prefix=f"zoo_{name.replace('/', '_')}_", dir=args.workdir))
    missing = _missing_module(name, src)
    if missing:
        # The reference cannot import it either: nothing to train or compare.
        return {
            "model": name,
            "note": "",
            "CPU": "not in release",
            "CSX": "-",
            "YAML": "-",
            "difference": "",
            "error": f"the registry names {missing}, which this zoo checkout lacks",
        }
    config, note = tiny_config(name, configs, processors, workdir)
    row = {
        "model": name,
        "note": note,
        "CPU": "-",
        "CSX": "-",
        "YAML": "-",
        "difference": "",
        "error": note if config is None else "",
    }
    if config is None:
        row["CPU"] = row["CSX"] = row["YAML"] = "no data"
        return row
    path = workdir / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    steps = args.steps
    # The reference builds the model first and saves its weights: torch's initialisers
    # changed between torch 2.4 and this torch (trunc_normal_ draws differently), so every
    # run then starts from those same weights (fit(ckpt_path=...), in YAML too).
    init = workdir / "initial_weights.mdl"
    # DiT casts its noised inputs to the half dtype whatever the precision: it runs only
    # mixed, which the zoo makes bfloat16 on CPU (reference and here alike).
    base = "shipped" if name in HALF_ONLY else "fp32"
    if base != "fp32":
        row["note"] += "; CPU and YAML runs bfloat16"
    # Data whose random draws differ between torch versions: the reference stores the
    # batches it trains on and this project's CPU run replays them for the comparison.
    replay = ("--batches", str(workdir / "batches.pt")) if name in REPLAY else ()
    ref = (
        run_worker(
            args.reference_python,
            src,
            False,
            path,
            "python",
            "CPU",
            base,
            steps,
            workdir,
            "--save-init",
            str(init),
            *replay,
        )
        if args.reference_python
        else None
    )
    start = ("--init", str(init)) if init.exists() else ()
    cpu = run_worker(
        args.zoo_python, src, True, path, "python", "CPU", base, steps, workdir, *start
    )
    cpu_on_ref_data = (
        run_worker(
            args.zoo_python,
            src,
            True,
            path,
            "python",
            "CPU",
            base,
            steps,
            workdir,
            *start,
            *replay,
            tag="_replay",
        )
        if replay and ref is not None
        else cpu
    )
    csx = run_worker(
        args.zoo_python, src, True, path, "python", "CSX", "shipped", steps, workdir, *start
    )
    cli = run_worker(args.zoo_python, src, True, path, "yaml", "CPU", base, steps, workdir, *start)
    ref_cli = (
        run_worker(
            args.reference_python, src, False, path, "yaml", "CPU", base, steps, workdir, *start
        )
        if ref is not None and _ok(cli, steps) and not replay
        else None
    )
    errors, diffs = [], []
    row["CPU"] = "ok" if _ok(cpu, steps) and _ok(cpu_on_ref_data, steps) else "FAIL"
    if ref is not None:
        if not _ok(ref, steps):
            row["CPU"] += " (ref fails)"
            errors.append(("reference", ref))
        elif _ok(cpu_on_ref_data, steps):
            diff = _rel(cpu_on_ref_data["losses"], ref["losses"])
            diffs.append(f"ref {diff:.1e}")
            if diff > 1e-4:
                row["CPU"] = "DIFFERS"
    if _ok(csx, steps):
        moved = len(set(csx["losses"])) > 1
        # A step whose gradients overflow at the loss scale is skipped (the scale halves):
        # from the next step on the run no longer follows fp32's, so tracking is measured
        # up to that step and the skip is shown.
        scales = csx.get("loss_scales") or []
        skipped = [i for i in range(1, len(scales)) if scales[i] < scales[i - 1]]
        compared = csx["losses"][: skipped[0] + 1] if skipped else csx["losses"]
        tracked = len(compared)  # steps over which CSX is compared with fp32
        track = _rel(compared, cpu["losses"][:tracked]) if _ok(cpu, steps) else math.inf
        diffs.append(f"csx {track:.1e}")
        updates_from = None
        if scales and len(skipped) == len(scales) - 1:
            # The scale fell at every step: every update may have been skipped. A longer
            # run shows whether the dynamic loss scale finds a value that fits.
            longer = run_worker(
                args.zoo_python,
                src,
                True,
                path,
                "python",
                "CSX",
                "shipped",
                steps + 12,
                workdir,
                *start,
                tag="_longer",
            )
            long_scales = longer.get("loss_scales") or []
            updates_from = next(
                (i + 1 for i in range(1, len(long_scales)) if long_scales[i] >= long_scales[i - 1]),
                None,
            )
            moved = updates_from is not None and len(set(longer["losses"][updates_from - 1 :])) > 1
            # the first step was skipped as well (its scale fell too): only its loss, taken
            # before any update, follows fp32's
            tracked = 1
            track = _rel(csx["losses"][:1], cpu["losses"][:1]) if _ok(cpu, steps) else math.inf
            diffs[-1] = f"csx {track:.1e}"
        row["CSX"] = "ok" if moved and track <= 1e-2 else ("no update" if not moved else "off fp32")
        if row["CSX"] == "off fp32" and ref is not None and _ok(ref, steps):
            # How far the reference's own run in the shipped precision (CPU mixed precision)
            # is from its fp32 run: a model whose loss is that sensitive to half precision
            # is judged against that gap, not against 1e-2.
            ref_half = run_worker(
                args.reference_python,
                src,
                False,
                path,
                "python",
                "CPU",
                "shipped",
                steps,
                workdir,
                *start,
                *replay,
            )
            if _ok(ref_half, steps):
                own = _rel(ref_half["losses"][:tracked], ref["losses"][:tracked])
                diffs.append(f"ref-half {own:.1e}")
                if track <= own:
                    row["CSX"] = f"ok (the reference's own half precision is {own:.1e} off fp32)"
        if updates_from:
            row["CSX"] += (
                f" (steps 1-{updates_from - 1} skipped as the scale fell to "
                f"2^{math.log2(long_scales[updates_from - 1]):.0f}; "
                f"updates from step {updates_from})"
            )
        elif scales:
            row["CSX"] += f" (scale 2^{math.log2(scales[-1]):.0f}"
            row["CSX"] += (
                f"; step {', '.join(str(i + 1) for i in skipped)} skipped)" if skipped else ")"
            )
    else:
        row["CSX"] = "FAIL"
    if _ok(cli, steps):
        # The YAML path builds some things its own way (e.g. optimizer parameter groups):
        # compared with the reference's YAML run where there is one, else with the CPU run.
        if ref_cli is not None and _ok(ref_cli, steps):
            diff = _rel(cli["losses"], ref_cli["losses"])
            diffs.append(f"yaml-ref {diff:.1e}")
            row["YAML"] = "ok" if diff <= 1e-4 else "DIFFERS"
        else:
            same = _ok(cpu, steps) and _rel(cli["losses"], cpu["losses"]) <= 1e-6
            row["YAML"] = "ok" if same else "DIFFERS"
            if ref_cli is not None:
                row["YAML"] += " (ref yaml fails)"
    else:
        row["YAML"] = "FAIL"
    runs = [("CPU", cpu), ("CSX", csx), ("YAML", cli)]
    if cpu_on_ref_data is not cpu:
        runs.insert(1, ("CPU on the reference's data", cpu_on_ref_data))
    for label, result in runs:
        if result.get("error"):
            errors.append((label, result))
    row["difference"] = ", ".join(diffs)
    if errors:
        label, result = errors[0]
        error = result["error"]
        row["error"] = (
            f"{label}: {error['type']}: {error['message'][:120]} "
            f"({_short_where(error['where'], src)})"
        )
    row["workdir"] = str(workdir)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="a Model Zoo checkout's src/ folder")
    parser.add_argument("--zoo-python", default=sys.executable)
    parser.add_argument("--reference-python", default=os.environ.get("REFERENCE_PYTHON"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", help="comma-separated registry names (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=str(ROOT / "artifacts" / "zoo_sweep.json"))
    args = parser.parse_args(argv)
    src = Path(args.src).resolve()
    registry = yaml.safe_load(
        (src / "cerebras" / "modelzoo" / "registry" / "registry.yaml").read_text()
    )["models"]
    wanted = set(args.models.split(",")) if args.models else None
    entries = [m for m in registry if wanted is None or m["name"] in wanted]
    configs = shipped_configs(src)
    DATA_PROCESSORS.update(
        {
            m["name"]: {p.rsplit(".", 1)[-1] for p in m.get("data_processor_paths") or []}
            for m in registry
        }
    )
    MODEL_PATHS.update({m["name"]: m["path"] for m in registry})
    global ZOO_HAS_TORCHVISION
    ZOO_HAS_TORCHVISION = (
        subprocess.run(
            [args.zoo_python, "-c", "import torchvision.transforms"],
            capture_output=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        ).returncode
        == 0
    )
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)

    def one(entry):
        processors = {p.rsplit(".", 1)[-1] for p in entry.get("data_processor_paths") or []}
        row = sweep_model(entry["name"], processors, configs, args, src)
        print(
            f"[{row['model']}] CPU {row['CPU']} | CSX {row['CSX']} | YAML {row['YAML']} | "
            f"{row['difference']} | {row['error']}",
            flush=True,
        )
        return row

    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(one, entries))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
    headers = ["model", "CPU", "CSX", "YAML", "difference", "first error (file:line)"]
    table = [[r["model"], r["CPU"], r["CSX"], r["YAML"], r["difference"], r["error"]] for r in rows]
    print("\n| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for line in table:
        print("| " + " | ".join(str(c).replace("|", "/") for c in line) + " |")
    failed = sum(1 for r in rows if "FAIL" in (r["CPU"] + r["CSX"] + r["YAML"]))
    print(f"\n{len(rows)} models; {failed} with a failing run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
