"""``Group``: different sparsity algorithms for different parameters (by name filter)."""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import re
import warnings
from typing import Callable, Dict, Union

import torch

from cstorch.sparse.base import SparsityAlgorithm
from jax_backend.errors import (
    CstorchNotImplementedError,
    CstorchRuntimeError,
    CstorchTypeError,
    CstorchValueError,
)


class Group(SparsityAlgorithm):
    """Applies the first matching algorithm to each parameter::

        sparsity = cstorch.sparse.Group({
            "fc1.*": cstorch.sparse.Static(sparsity=0.5),
            "fc2.*": cstorch.sparse.GMP(sparsity={"type": "linear", "init": 0.0,
                                                  "slope": 0.01}, update={"freq": 10}),
        })
        model.apply(sparsity)
        optimizer.apply(sparsity)

    Filters are glob patterns over parameter names (a string or a list of them) or functions
    ``(name, param) -> bool``.
    """

    @dataclasses.dataclass
    class Filter:
        filter: Callable[[str, torch.Tensor], bool]
        algorithm: SparsityAlgorithm

    def __init__(self, groups: Dict[str, SparsityAlgorithm] = None):
        super().__init__(sparsity=None)
        self._groups = []
        for group_filter, algorithm in (groups or {}).items():
            self.add(group_filter, algorithm)

    @property
    def num_sparse_params(self) -> int:
        return sum(len(g.algorithm.sparse_params) for g in self._groups)

    @property
    def sparsity(self):
        raise CstorchNotImplementedError(
            "Group sparsity algorithm does not have a sparsity level. You can access the "
            "sparsity of nested sparsity algorithms by indexing the Group object, i.e. "
            "group[0].sparsity"
        )

    def __getitem__(self, index) -> SparsityAlgorithm:
        return self._groups[index].algorithm

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, filter: Union[str, list, Callable], algorithm: SparsityAlgorithm) -> None:
        """Adds ``algorithm`` for the parameters ``filter`` matches."""
        if not isinstance(algorithm, SparsityAlgorithm):
            raise CstorchTypeError(
                f"algorithm must be an instance of SparsityAlgorithm, got {type(algorithm)}"
            )
        if isinstance(algorithm, Group):
            raise CstorchTypeError(
                "algorithm must be not be Group sparsity algorithm. If you want to "
                "merge groups, use the extend method."
            )
        if isinstance(filter, str):
            filter = [filter]
        if isinstance(filter, (list, tuple)):
            if not all(isinstance(f, str) for f in filter):
                raise CstorchTypeError(f"filter patterns must be strings, got {filter!r}")
            patterns = [re.compile(fnmatch.translate(f)) for f in filter]
            matcher = lambda name, _: any(p.match(name) for p in patterns)  # noqa: E731
        elif callable(filter):
            matcher = filter
        else:
            raise CstorchTypeError(f"filter must be a string or callable, got {type(filter)}")
        self._groups.append(Group.Filter(matcher, algorithm))
        self._collect(algorithm)

    def _collect(self, algorithm) -> None:
        self.sparse_params.update(algorithm.sparse_params)
        self._params_by_id.update(algorithm._params_by_id)

    def extend(self, group: "Group") -> None:
        """Adds the filters and algorithms of another ``Group``."""
        if not isinstance(group, Group):
            raise CstorchTypeError(f"group must be an instance of Group, got {type(group)}")
        for g in group._groups:
            self.add(g.filter, g.algorithm)

    def sparsify_parameter(self, module, name, param) -> None:
        if param is None or self.get_sparse_params(param) is not None:
            return
        if getattr(param, "requires_dense", False):
            return
        for group in self._groups:
            if group.filter(name, param):
                logging.debug(f"Sparsity filter matched: {name}")
                group.algorithm.sparsify_parameter(module, name, param)
                self._collect(group.algorithm)
                return

    def sparsify_module(self, module) -> None:
        if not self._groups:
            raise CstorchRuntimeError("No groups were added to the Group sparsity algorithm")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            super().sparsify_module(module)
        for w in caught:
            if not str(w.message).startswith("No parameters were sparsified"):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if self.num_sparse_params == 0:
            warnings.warn(
                "No parameters were sparsified in the module. This is likely due to the "
                "parameter filter not matching any parameters in the module"
            )

    def _forward_pre_hook(self, module, args) -> None:
        for group in self._groups:
            group.algorithm._forward_pre_hook(module, args)

    def sparsify_optimizer(self, optimizer) -> None:
        super().sparsify_optimizer(optimizer)
        for group in self._groups:
            group.algorithm.sparsify_optimizer(optimizer)

    def initialize(self) -> None:
        for group in self._groups:
            group.algorithm.initialize()

    def update(self, optimizer=None) -> None:
        for group in self._groups:
            group.algorithm.update(optimizer)

    def register_target_sparsity_hook(self, hook):
        return [g.algorithm.register_target_sparsity_hook(hook) for g in self._groups]

    def register_computed_sparsity_hook(self, hook):
        return [g.algorithm.register_computed_sparsity_hook(hook) for g in self._groups]

    def visit_state(self, f) -> None:
        for group in self._groups:
            group.algorithm.visit_state(f)

    def state_dict(self) -> list:
        return [group.algorithm.state_dict() for group in self._groups]

    def load_state_dict(self, state_dict) -> None:
        if isinstance(state_dict, dict):
            state_dict = [state_dict]
        if not isinstance(state_dict, list) or len(state_dict) != len(self._groups):
            count = len(state_dict) if isinstance(state_dict, list) else type(state_dict)
            raise CstorchValueError(
                f"Expected a list of {len(self._groups)} state_dicts for the Group sparsity "
                f"algorithm but got {count}."
            )
        for state, group in zip(state_dict, self._groups):
            group.algorithm.load_state_dict(state)
