"""Which parameters did this forward use? Walk the autograd graph from the outputs, as torch DDP does."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch


def find_tensors(obj) -> list[torch.Tensor]:
    """The tensors inside a forward's output: nested lists, tuples, dicts and dataclasses (torch's
    `_find_tensors` covers the same cases; a HuggingFace ModelOutput is a dict)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in find_tensors(item)]
    if isinstance(obj, Mapping):
        return [t for item in obj.values() for t in find_tensors(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in find_tensors(getattr(obj, f.name))]
    return []


def used_parameters(outputs) -> set[int]:
    """ids of the leaf tensors (parameters) reachable from the tensors in `outputs` through grad_fn."""
    leaves = find_tensors(outputs)
    stack = [t.grad_fn for t in leaves if t.grad_fn is not None]
    seen, used = set(), {id(t) for t in leaves if t.grad_fn is None and t.requires_grad}
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):  # AccumulateGrad: the node that writes a leaf's .grad
            used.add(id(fn.variable))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return used
