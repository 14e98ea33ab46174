"""Pins and defaults of deploy/ (one place; the README and the template quote these).

SDK profiles: what one Neuron SDK release puts on its DLAMI, i.e. what the bench
host runs. 2.32.0 (NKI 0.6.0, released 2026-08-17) is the default; 2.31.0 (NKI
0.5.0, the last with torch-neuronx / PyTorch 2.9) is the option. Versions are
those of the SDK package manifest (``n2-manifest.json`` of aws-neuron/aws-neuron-sdk)
and, for 2.32.0, of the vLLM 0.24.0.1.1.0 container, whose Dockerfile installs the
same venv as the DLAMI (aws-neuron/deep-learning-containers
``vllm/inference/0.24.0.1.1.0/Dockerfile.neuronx``: ``NEURONX_CC_VERSION=2.27.5334.0+...``,
``NKI_VERSION=0.6.0+...``, runtime-lib 2.34.10.0, tools 2.32.28.0).

Images (aws-neuron-sdk ``deploy/environments/dlami.rst`` at 81ce03ae, and
``release-notes/components/dlamis.rst``): the 2.32 multi-framework Ubuntu 24.04 DLAMI
holds two venvs, ``/opt/aws_neuronx_venv_jax_0_10`` and
``/opt/aws_neuronx_venv_pytorch_inference_vllm_0_24_0_1_1_0``; the PyTorch 2.9 DLAMI
and venvs stopped with 2.32, so that DLAMI's latest image is a 2.31 one. The DLAMI
release notes list 2.31.0 images and none for 2.31.1, hence the 2.31.0 profile
(tools 2.31.13.0; 2.31.1 only bumped tools to 2.31.15.0).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SdkProfile:
    """One SDK release as its DLAMI ships it."""

    release: str            # Neuron SDK release, as in the AMI description ("Neuron SDK 2.32.0")
    nki: str                # the NKI version of the release
    dlami: str              # key of DLAMI_SSM_PARAMETERS
    image_name: str         # describe-images name filter: framework, OS (the release is in the description)
    venv: str               # venv on that image holding nki and neuronx-cc
    extra: str              # pyproject extra installed on the host (pins == pip_pins)
    pip_pins: dict          # checked with importlib.metadata before anything compiles
    apt_pins: dict          # checked with dpkg-query
    torch_path: str         # how torch tensors reach the kernels there (nki_ssm/torch/neuron.py)


DLAMI_SSM_PARAMETERS = {
    "multi-framework": "/aws/service/neuron/dlami/multi-framework/ubuntu-24.04/latest/image_id",
    "pytorch-2.9": "/aws/service/neuron/dlami/pytorch-2.9/ubuntu-24.04/latest/image_id",
}

SDK_PROFILES = {
    "2.32.0": SdkProfile(
        release="2.32.0", nki="0.6.0", dlami="multi-framework",
        image_name="Deep Learning AMI Neuron (Ubuntu 24.04) *",
        venv="/opt/aws_neuronx_venv_pytorch_inference_vllm_0_24_0_1_1_0", extra="neuron",
        pip_pins={"neuronx-cc": "2.27.5334.0", "nki": "0.6.0"},
        apt_pins={"aws-neuronx-runtime-lib": "2.34.10.0", "aws-neuronx-tools": "2.32.28.0"},
        torch_path="vLLM Neuron 0.24 (libtorch_neuronx_lite, device 'neuron'): wrap_nki HOP"),
    "2.31.0": SdkProfile(
        release="2.31.0", nki="0.5.0", dlami="pytorch-2.9",
        image_name="Deep Learning AMI Neuron PyTorch 2.9 (Ubuntu 24.04) *",
        venv="/opt/aws_neuronx_venv_pytorch_2_9", extra="neuron-2-31",
        pip_pins={"neuronx-cc": "2.26.6360.0", "nki": "0.5.0",
                  "torch-neuronx": "2.9.0.2.15.32035"},
        apt_pins={"aws-neuronx-runtime-lib": "2.33.10.0", "aws-neuronx-tools": "2.31.13.0"},
        torch_path="torch-neuronx 2.9 (PyTorch/XLA, device 'xla'): @nki.jit called with XLA tensors"),
}
DEFAULT_SDK = "2.32.0"
# the default profile's values under their historical names (the same dict objects)
SDK_RELEASE = SDK_PROFILES[DEFAULT_SDK].release
PIP_PINS = SDK_PROFILES[DEFAULT_SDK].pip_pins
APT_PINS = SDK_PROFILES[DEFAULT_SDK].apt_pins
DLAMI_VENV = SDK_PROFILES[DEFAULT_SDK].venv
DEFAULT_DLAMI = SDK_PROFILES[DEFAULT_SDK].dlami
DLAMI_OWNER = "amazon"
NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
NEURON_TOOLS_BIN = "/opt/aws/neuron/bin"

# Where trn2 is offered. The evidence conflicts: aws-neuron/nki-moe#14 finds no
# trn2.3xlarge in US East, the Capacity Blocks docs list trn2.48xlarge in us-east-2, teams
# launch trn2.3xlarge in ap-southeast-4 and sa-east-1 and hit InsufficientInstanceCapacity
# there at times (nki-moe#9). moto 5.2.5's offerings data, generated from
# describe-instance-type-offerings (moto/ec2/resources/instance_type_offerings), agrees.
# Default: ap-southeast-4 + trn2.3xlarge, the one pair with both an offering and a price
# figure (REFERENCE_PRICES_USD); README "Where trn2 is" says why and what else to try.
OFFERING_EVIDENCE = (
    ("ap-southeast-4", "trn2.3xlarge",
     "moto 5.2.5 offerings data (zone ap-southeast-4c); aws-neuron/nki-moe#9 (teams launch "
     "there; InsufficientInstanceCapacity at times); on-demand $2.235/h in a third-party report"),
    ("sa-east-1", "trn2.3xlarge",
     "moto 5.2.5 offerings data (zones sa-east-1a/b/c); aws-neuron/nki-moe#9 and #14; "
     "skypilot-org/skypilot#9030"),
    ("ap-south-2", "trn2.3xlarge", "moto 5.2.5 offerings data (zones ap-south-2a/b/c)"),
    ("us-east-2", "trn2.48xlarge",
     "EC2 Capacity Blocks for ML docs (trn2.48xlarge in us-east-2); moto 5.2.5 offerings data "
     "(zones us-east-2a/b/c); 16 chips: --capacity-reservation-id"),
)
DEFAULT_REGION = "ap-southeast-4"
DEFAULT_INSTANCE_TYPE = "trn2.3xlarge"
# families whose types are discovered at run time (describe-instance-types), never listed here
DISCOVERED_FAMILIES = ("trn2", "trn2u", "trn3")
DEFAULT_TTL_HOURS = 4.0
MIN_TTL_HOURS = 0.5           # room for the SSM command's own margins (workflow.run_timeouts)
MAX_TTL_HOURS = 48.0
# the multi-framework DLAMI setup guide: "configure disk size (minimum 512 GB for Trn
# instances)" (aws-neuron-sdk setup/multiframework-dlami.rst)
ROOT_VOLUME_GB = 512
RESULTS_PREFIX = "nki-ssm-bench"

# Tags: every resource carries these, teardown finds everything by TAG_RUN_ID.
TAG_PROJECT = "nki-ssm:project"
TAG_RUN_ID = "nki-ssm:run-id"
TAG_TTL_EXPIRES = "nki-ssm:ttl-expires"   # ISO 8601 UTC; teardown --expired uses it
PROJECT = "nki-ssm-bench"
IAM_PATH = "/nki-ssm-bench/"
SSM_CORE_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"

# Hourly on-demand price when the AWS Price List API cannot be asked (no
# credentials): third-party figures, UNVERIFIED; the plan labels them so. With
# credentials the plan asks pricing:GetProducts; --hourly-price overrides both.
REFERENCE_PRICES_USD = {
    ("trn2.3xlarge", "ap-southeast-4"): (
        2.235, "third-party benchmark report (AWS on-demand, ap-southeast-4, 2026-05), unverified"),
}
# The rest of the bill, list prices of AWS's pricing pages (US East; other regions cost
# somewhat more), UNVERIFIED offline: gp3 storage per GB-month while the host lives, and
# S3 transfer out to the internet when `collect` downloads the results.
EBS_GP3_USD_PER_GB_MONTH = 0.08
S3_EGRESS_USD_PER_GB = 0.09
HOURS_PER_MONTH = 730
# Results size per case, ASSUMED (nothing measured yet): saved inputs and one NTFF per
# profiled execution; the plan shows the figure and its basis.
ASSUMED_INPUTS_MB_PER_CASE = 20.0
ASSUMED_NTFF_MB = 8.0
