"""The PyTorch helper of ``gpufleet_hook``: a model's flops per step, counted once.

    from gpufleet_hook import Hook
    from gpufleet_hook.pytorch import count_flops
    hook = Hook(model="llama-8b", flops_per_step=count_flops(model, example_batch))

torch is imported when :func:`count_flops` runs, never when ``gpufleet_hook`` is imported, so
the hook itself needs nothing but the standard library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def count_flops(
    model: Any,
    inputs: Any,
    *,
    loss: Callable[[Any], Any] | None = None,
    backward: bool = True,
) -> float:
    """Floating-point operations of one training step of ``model`` on ``inputs`` (a tensor, or
    a tuple of positional arguments), counted once with ``torch.utils.flop_counter.
    FlopCounterMode``: the forward pass and, with ``backward``, the backward pass of
    ``loss(output)`` (default: the output's sum). Run it on one real batch before training;
    the optimiser step and the data loader are not counted (they are small against the
    matrix multiplications that MFU measures). The model's gradients are cleared after."""
    from torch.utils.flop_counter import FlopCounterMode

    args = inputs if isinstance(inputs, tuple) else (inputs,)
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(*args)
        if backward:
            value = loss(out) if loss is not None else out.sum()
            value.backward()
    if backward:
        for p in model.parameters():
            p.grad = None
    return float(counter.get_total_flops())
