"""Pins and defaults of deploy/ (one place; the README and the template quote these).

SDK: 2.31.1 is the last Neuron SDK release with torch-neuronx (the shared
reference's integration notes §1: 2.32.0 ships no torch-neuronx, NxD or NxDI).
Versions are those of the 2.31 column of that table (SDK package manifest
``n2-manifest.json``; 2.31.1 bumps only aws-neuronx-tools).
"""
from __future__ import annotations

SDK_RELEASE = "2.31.1"
# pip pins of the `neuron` extra (pyproject.toml) and of the on-host check
PIP_PINS = {
    "neuronx-cc": "2.26.6360.0",
    "nki": "0.5.0",
    "torch-neuronx": "2.9.0.2.15.32035",
}
# apt packages of the same release (checked with dpkg-query on the host)
APT_PINS = {
    "aws-neuronx-runtime-lib": "2.33.10.0",
    "aws-neuronx-tools": "2.31.15.0",
}
NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
NEURON_TOOLS_BIN = "/opt/aws/neuron/bin"

# DLAMI: the PyTorch 2.9 single-framework DLAMI stopped being published with
# 2.32 (release-notes/components/dlamis.rst 2.32.0), so its SSM "latest" is the
# last 2.31.x image. The multi-framework one moves with every release.
DLAMI_SSM_PARAMETERS = {
    "pytorch-2.9": "/aws/service/neuron/dlami/pytorch-2.9/ubuntu-24.04/latest/image_id",
    "multi-framework": "/aws/service/neuron/dlami/multi-framework/ubuntu-24.04/latest/image_id",
}
DEFAULT_DLAMI = "pytorch-2.9"
DLAMI_VENV = "/opt/aws_neuronx_venv_pytorch_2_9"
# describe-images filters for an AMI pinned by SDK release (integration notes §4.2)
DLAMI_NAME_PATTERN = "Deep Learning AMI Neuron*"
DLAMI_OWNER = "amazon"

DEFAULT_REGION = "us-east-2"
DEFAULT_INSTANCE_TYPE = "trn2.3xlarge"
# families whose types are discovered at run time (describe-instance-types), never listed here
DISCOVERED_FAMILIES = ("trn2", "trn2u", "trn3")
DEFAULT_TTL_HOURS = 4.0
MAX_TTL_HOURS = 48.0
ROOT_VOLUME_GB = 200          # DLAMI Ubuntu needs >= 50 GB; NEFFs and profiles need room
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
    "trn2.3xlarge": (2.235, "third-party benchmark report (AWS on-demand, ap-southeast-4, 2026-05), "
                            "unverified"),
}
