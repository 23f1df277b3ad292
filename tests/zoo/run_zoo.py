"""Train (and validate) a Cerebras Model Zoo model through the zoo's own ``Trainer``.

This is what a zoo user writes in Python (no YAML): build the model from the zoo's config
class, hand the Trainer an optimizer, a loop, a checkpoint schedule and the zoo's fake-data
loader, call ``fit`` and then ``validate`` on the last checkpoint. It needs only
``cerebras.pytorch`` and a zoo checkout's ``src`` on ``sys.path``; the same script runs on
cerebras-pytorch 2.10 itself, which is how the reference losses in
``tests/data/zoo_fc_mnist_reference.json`` were made.

    python tests/zoo/run_zoo.py --model fc_mnist --device CPU --steps 20 --out losses.json

Writes ``{"train_losses": [...], "val_losses": [...], "checkpoints": [...]}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import torch

import cerebras.pytorch as cstorch


def fc_mnist(batch_size: int):
    from cerebras.modelzoo.models.vision.fc_mnist.data import MNISTDataProcessor
    from cerebras.modelzoo.models.vision.fc_mnist.model import MNISTModel

    def model():
        return MNISTModel(
            dict(
                name="fc_mnist",
                depth=10,
                hidden_size=50,
                dropout=0.0,
                activation_fn="relu",
                to_float16=False,
            )
        )

    def loader(split, seed):
        def input_fn():
            return MNISTDataProcessor(
                dict(
                    data_processor="MNISTDataProcessor",
                    use_fake_data=True,
                    fake_data_seed=seed,
                    batch_size=batch_size,
                    split=split,
                )
            ).create_dataloader()

        return cstorch.utils.data.DataLoader(input_fn)

    return model, loader("train", 1), loader("val", 2), 0.001


def gpt2(batch_size: int):
    import numpy as np
    from cerebras.modelzoo.data.nlp.gpt.DummyDataProcessor import (
        DummyDataProcessor,
    )
    from cerebras.modelzoo.registry import registry

    if not hasattr(np, "cast"):
        # The zoo's dummy GPT data calls np.cast["int32"](x), removed in numpy 2 (which JAX
        # requires); give that one helper back so the zoo's own fake data can be used.
        np.cast = {
            name: (lambda x, name=name: np.asarray(x, dtype=name))
            for name in ("int32", "int64", "float32")
        }

    model_cls = registry.get_model_class("gpt2")

    def model():
        # The dummy data has sequences of 128 tokens from a 32000-token vocabulary.
        return model_cls(
            dict(
                name="gpt2",
                vocab_size=32000,
                hidden_size=32,
                num_hidden_layers=2,
                num_heads=2,
                filter_size=64,
                max_position_embeddings=128,
                embedding_dropout_rate=0.0,
                dropout_rate=0.0,
                attention_dropout_rate=0.0,
            )
        )

    def loader():
        def input_fn():
            return DummyDataProcessor(
                dict(
                    data_processor="GenericDataProcessor",
                    batch_size=batch_size,
                    shuffle=False,
                    shuffle_seed=1,
                    num_workers=0,
                )
            ).create_dataloader()

        return cstorch.utils.data.DataLoader(input_fn)

    return model, loader(), loader(), 0.01


MODELS = {"fc_mnist": fc_mnist, "gpt2": gpt2}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="fc_mnist")
    parser.add_argument("--device", choices=["CPU", "CSX"], default="CPU")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint-steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--mixed-precision",
        choices=["on", "off"],
        default="on",
        help="the zoo's MixedPrecision(enabled=...): bfloat16 on CPU when on",
    )
    parser.add_argument("--model-dir", default="./model_dir")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from cerebras.modelzoo.trainer import Trainer
    from cerebras.modelzoo.trainer.callbacks import (
        Callback,
        Checkpoint,
        DurationProfiler,
        Logging,
        MixedPrecision,
        RateProfiler,
        TrainingLoop,
        ValidationLoop,
    )
    from cerebras.modelzoo.trainer.loggers import ProgressLogger

    model_fn, train_dl, val_dl, lr = MODELS[args.model](args.batch_size)
    result = {"train_losses": [], "val_losses": []}

    class RecordLosses(Callback):
        def on_train_batch_end(self, trainer, model, outputs, batch, batch_idx):
            self.record("train_losses", outputs["loss"])

        def on_validate_batch_end(self, trainer, model, outputs, batch, batch_idx):
            self.record("val_losses", outputs["loss"])

        @cstorch.step_closure
        def record(self, key, loss):
            result[key].append(float(loss))

    trainer = Trainer(
        device=args.device,
        model_dir=args.model_dir,
        model=model_fn,
        optimizer=lambda model: cstorch.optim.SGD(model.parameters(), lr=lr, momentum=0.0),
        schedulers=[lambda opt: cstorch.optim.lr_scheduler.ConstantLR(opt, learning_rate=lr)],
        precision=MixedPrecision(enabled=args.mixed_precision == "on", loss_scaling_factor=1.0),
        loop=TrainingLoop(num_steps=args.steps, eval_frequency=None),
        checkpoint=Checkpoint(steps=args.checkpoint_steps),
        logging=Logging(log_steps=1),
        # the zoo's profilers time steps from the tensors received on CSX
        callbacks=[RecordLosses(), RateProfiler(), DurationProfiler()],
        loggers=[ProgressLogger()],
        seed=args.seed,
    )
    trainer.fit(train_dl)
    checkpoints = sorted(
        glob.glob(os.path.join(args.model_dir, "checkpoint_*.mdl")),
        key=lambda p: int(os.path.basename(p)[len("checkpoint_") : -4]),
    )
    result["checkpoints"] = [os.path.basename(c) for c in checkpoints]
    if checkpoints:
        trainer.validate(val_dl, ckpt_path=checkpoints[-1], loop=ValidationLoop(eval_steps=3))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    torch.set_num_threads(1)  # deterministic CPU reductions, same as the reference run
    main()
