"""On-host bench: compile every kernel with the real NKI / neuronx-cc, run it on the device
against the float64 reference, time it with neuron-explorer, write results.json.

``python -m deploy.bench`` (see ``__main__``); one case runs in its own
process (``deploy.bench.worker``, in a working directory of its own) so
NKI_ARTIFACTS_DIR (read when ``nki`` is imported) can be set per case, the NEFF
found wherever the SDK writes it, and a crashing compile cannot take the run down.
"""
