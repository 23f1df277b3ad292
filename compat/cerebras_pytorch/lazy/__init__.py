"""``cerebras_pytorch.lazy``: the 1.x (releases 1.6 to 1.9) lazy-tensor API, on this engine.

In 1.x the Model Zoo's appliance runner drove the Cerebras stack the way PyTorch/XLA is
driven: ``cbtorch.initialize(appliance=True)``, the model and optimizer wrapped by
``cbtorch.module``/``cbtorch.optimizer``, a ``cbtorch.dataloader`` whose iterations mark the
step boundaries (``cm.mark_step``), ``cm.step_closure`` for host work on a step's values, and
``cbtorch.core.appliance.ApplianceMode`` that compiles the first iteration's graph and runs
every step on the system. The runner makes the first iteration the only traced one: after it,
its ``train_forward`` returns the loss the appliance computed and its backward and optimizer
methods do nothing.

Here that first iteration is what becomes one captured, jitted cstorch step
(``appliance.ApplianceMode``): the step's body is the runner's own per-batch methods, the
same every iteration (the static-graph rule); the appliance runs it on the CSX backend (the
modeled wafer) for each batch of its own stream of the training data, from the initial
state the runner saved, and hands back each step's loss. Modules:

* ``cb_model``: ``cbtorch.core.cb_model`` (``cm``): the process queries and step closures;
* ``api``: the top-level names (``initialize``, ``module``, ``optimizer``, ``dataloader``,
  ``state``, ``env``, ``Session``, ...);
* ``appliance``: ``cbtorch.core.appliance.ApplianceMode``;
* ``_run``: the one per-process record of the 1.x run these share;
* ``xla_pieces``: the two PyTorch/XLA pieces the 1.6 zoo imports on a CS system
  (``torch_xla.utils.utils.SampleGenerator``, ``torch_xla._XLAC._xla_set_parameter_name``),
  importable only from ``initialize(appliance=True)`` until the run is reset.
"""
