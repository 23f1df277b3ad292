"""The command line: ``python -m cerebras.modelzoo.trainer fit params.yaml`` (also ``cszoo``).

``cszoo fit|validate|validate_all params.yaml [--device CPU] [--model_dir DIR]
[--import MODULE ...]``: the legacy modes train, eval, train_and_eval and eval_all are also
accepted. ``--import`` imports modules that register models and data processors, and lets
the config's import paths name them (``registry.IMPORT_RULE``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from cerebras.modelzoo.trainer.config import TrainerConfigError
from cerebras.modelzoo.trainer.legacy import (
    convert_legacy_params_to_trainer_params,
    is_legacy_params,
)
from cerebras.modelzoo.trainer.registry import allow_imports
from cerebras.modelzoo.trainer.utils import MODES, load_params, run_trainer


def _override(params, device, model_dir):
    phases = params["trainer"]
    for phase in phases if isinstance(phases, list) else [phases]:
        init = phase.setdefault("init", {})
        if device is not None:
            init.pop("device", None)
            backend = init.setdefault("backend", {})
            backend["backend_type"] = device.upper()
        if model_dir is not None:
            init["model_dir"] = model_dir
    return params


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="cszoo", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument(
        "params",
        help="a YAML file with a `trainer` section (or legacy runconfig/train_input/... sections)",
    )
    parser.add_argument(
        "--device",
        choices=["CPU", "GPU", "CSX", "cpu", "gpu", "csx"],
        help="overrides init.device / init.backend.backend_type",
    )
    parser.add_argument("--model_dir", help="overrides init.model_dir")
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it may register models "
        "and data processors) and let the config's "
        "import paths name it; repeatable",
    )
    args = parser.parse_args(argv)
    # Import paths in the YAML (``examples.trainer_mnist:Model``) resolve from the working
    # directory, as under ``python -m``; a console script's sys.path lacks it.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in args.imports:  # (the user's own choice: configs may then name it too)
        allow_imports(module)
        importlib.import_module(module)
    try:
        params = load_params(args.params)
        if is_legacy_params(params):
            params = convert_legacy_params_to_trainer_params(params)
        run_trainer(args.mode, _override(params, args.device, args.model_dir))
    except (TrainerConfigError, FileNotFoundError) as error:
        # A problem with the params file, said in a few lines (no traceback): what and where.
        # (A FileNotFoundError with a filename comes from user code: keep its traceback.)
        if isinstance(error, FileNotFoundError) and error.filename not in (None, args.params):
            raise
        print(f"{parser.prog}: error in {args.params}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
