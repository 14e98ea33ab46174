"""The device a torch call runs on, and the check that every tensor argument is on it.

A call runs on the device of its leading activation (``x``, or ``q`` for Gated
DeltaNet): the CPU (the host API on NumPy views of the tensors) or a Neuron
device (``nki_ssm.torch.neuron``: device tensors straight to the kernels): the
native ``neuron`` device of TorchNeuron and vLLM Neuron (SDK 2.33, 2.34), or
torch-neuronx 2.9's lazy ``xla`` device (SDK 2.31 and older), as the integration
layer supports them.

Every other tensor argument must be on that same device, index tensors
included. Without the check torch itself picks the kernel from the devices of
all arguments: one ``meta`` tensor sends the call to the fake kernel
(uninitialised output, pool never written, no error), and the CPU path would
read device memory it cannot see. A tensor elsewhere is a ValueError naming it.
"""
from __future__ import annotations

import torch

from .neuron import DEVICE_TYPES as NEURON_DEVICE_TYPES
RUN_DEVICE_TYPES = ("cpu",) + NEURON_DEVICE_TYPES


def check_devices(tensors: dict, lead: str) -> torch.device:
    """``tensors`` (argument name -> tensor or anything else, which is skipped) all on the
    device of ``tensors[lead]``, a CPU or Neuron device -> that device."""
    device = tensors[lead].device
    if device.type not in RUN_DEVICE_TYPES:
        raise ValueError(f"{lead} must be on the CPU or a Neuron device "
                         f"({' / '.join(NEURON_DEVICE_TYPES)}), got a tensor on {device}")
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor) and value.device != device:
            raise ValueError(f"{name} must be on the device of {lead} ({device}), "
                             f"got a tensor on {value.device}")
    return device
