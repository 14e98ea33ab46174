"""PyTorch integration (optional extra ``torch``): custom ops, drop-ins and model patching.

- ``nki_ssm.torch.ops``: ``torch.library`` custom ops ``torch.ops.nki_ssm.*`` for the six
  pool-based ops of ``nki_ssm.ops`` (fake kernels, pools declared mutated);
- ``nki_ssm.torch.training``: functional training ops ``torch.ops.nki_ssm.*_train`` (initial
  states in, output and final states out, no pool) with autograd;
- ``nki_ssm.torch.fla``, ``.mamba_ssm``, ``.causal_conv1d``: drop-ins with the GPU peers'
  signatures, defaults and return values, running on our kernels;
- ``nki_ssm.torch.hf.patch(model)``: puts our kernels under a transformers model's
  Gated DeltaNet / Mamba-2 layers;
- ``nki_ssm.torch.neuron``: the device path (``neuron`` tensors of TorchNeuron or vLLM Neuron ->
  ``@nki.jit`` kernels).

``set_backend`` / ``use_backend`` choose the backend the drop-ins pass to the ops
(None: what ``NKI_SSM_BACKEND`` picks, a kernel's NKI implementation or the references; "reference":
the float64 reference; "sim" / "neuron": that NKI implementation).
"""
try:
    import torch  # noqa: F401
except ImportError as exc:   # the torch extra is optional
    raise ImportError("nki_ssm.torch needs PyTorch: pip install 'nki-ssm[torch]' "
                      "(from a clone: pip install -e '.[torch]')") from exc

from . import ops, training  # noqa: E402
from ._convert import get_backend, set_backend, use_backend  # noqa: E402

__all__ = ["ops", "training", "get_backend", "set_backend", "use_backend"]
