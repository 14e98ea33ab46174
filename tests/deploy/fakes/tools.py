"""FAKE Neuron command-line tools for the deploy tests (not the real binaries).

neuronx-cc --version; neuron-ls --json-output; dpkg-query -W -f=${Version} <pkg>
(versions of the SDK release FAKE_NEURON_SDK, default 2.34.0);
neuron-explorer capture (writes one NTFF per execution, named as the real tool
does) and view --output-format summary-json (prints a summary in the documented
shape; the times are FABRICATED: executions 1..3 take 60 us (warm-up), later
ones 10 / 11 / 12 us in turn).
"""
from __future__ import annotations

import json
import os
import sys

APT_VERSIONS = {
    "2.34.0": {"aws-neuronx-runtime-lib": "2.36.8.0-fake", "aws-neuronx-tools": "2.34.29.0-fake"},
    "2.33.0": {"aws-neuronx-runtime-lib": "2.35.30.0-fake", "aws-neuronx-tools": "2.33.38.0-fake"},
}
COMPILER = {"2.34.0": "2.29.16866.0", "2.33.0": "2.28.7631.0"}


def _sdk() -> str:
    return os.environ.get("FAKE_NEURON_SDK", "2.34.0")


def fake_time_s(k: int) -> float:
    return (60.0 if k <= 3 else 10.0 + (k % 3)) * 1e-6


def _opt(args, flag):
    i = args.index(flag)
    return args[i + 1]


def main(name: str, args: list[str]) -> int:
    if name == "neuronx-cc":
        print(f"NeuronX Compiler version {COMPILER[_sdk()]}+fake")
        return 0
    if name == "neuron-ls":
        if os.environ.get("FAKE_NEURON_DEVICE") != "1":
            print("neuron-ls: no Neuron device found", file=sys.stderr)
            return 1
        print(json.dumps([{"neuron_device": 0, "bdf": "00:1e.0", "nc_count": 8,
                           "memory_size": 103079215104, "neuron_processes": []}]))
        return 0
    if name == "dpkg-query":
        versions = APT_VERSIONS[_sdk()]
        print(versions.get(args[-1], ""), end="")
        return 0 if args[-1] in versions else 1
    if name == "neuron-explorer":
        return _explorer(args)
    return 2


def _explorer(args: list[str]) -> int:
    verb = args[0]
    neff, ntff = _opt(args, "-n"), _opt(args, "-s")
    if not os.path.isfile(neff):
        print(f"neuron-explorer: no such NEFF {neff}", file=sys.stderr)
        return 1
    if verb == "capture":
        n = int(_opt(args, "--num-exec"))
        rest = args[args.index("--num-exec") + 2:]
        pairs = list(zip(rest[0::2], rest[1::2]))
        for pname, path in pairs:
            if not os.path.isfile(path):
                print(f"neuron-explorer: input {pname}: no file {path}", file=sys.stderr)
                return 1
        base = ntff[:-5]
        for k in range(1, n + 1):
            path = ntff if k == 1 else f"{base}_exec_{k}.ntff"
            with open(path, "w") as fh:
                json.dump({"exec": k, "inputs": [p for p, _ in pairs]}, fh)
        print(f"captured {n} executions")
        return 0
    if verb == "view":
        assert _opt(args, "--output-format") == "summary-json"
        with open(ntff) as fh:
            k = json.load(fh)["exec"]
        t = fake_time_s(k)
        print(json.dumps({"n_fakehash_" + str(k): {
            "total_time": t, "mbu_estimated_percent": 0.42, "mfu_estimated_percent": 0.05,
            "hardware_flops": 1.0e9, "transpose_flops": 0.0}}))
        return 0
    return 2
