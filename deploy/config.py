"""Pins and defaults of deploy/ (one place; the README and the template quote these).

SDK profiles: what one Neuron SDK release puts on its DLAMI, i.e. what the bench host
runs. 2.34.0 (NKI 0.8.0, released 2026-11-30) is the default, 2.33.0 (NKI 0.7.0,
2026-10-19) the option. Package versions are those of each release's "Release content"
page (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.34.0/release-notes/releasecontent.html,
.../en/v2.33.0/release-notes/releasecontent.html).

Image: since 2.33 the "Deep Learning AMI Neuron torch-neuronx 2.14.0" DLAMI carries
TorchNeuron (PyTorch 2.14 on the native ``neuron`` device), ``neuronx-cc`` and ``nki`` in
``/opt/aws_neuronx_venv_torch_neuronx_2_14_0``, on Ubuntu 24.04 and 26.04; PyTorch/XLA
DLAMIs stopped after 2.31 (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/setup/pytorch/update-dlami.html).
Not verified in any page read: the DLAMI's SSM parameter (its name below follows the
documented scheme ``/aws/service/neuron/dlami/<framework>-<version>/<os>``), and that 2.34
keeps the 2.33 image and venv names. ``launch`` checks them on the account before it
creates anything (``deploy.provision.discover.resolve_ami``), the host script falls back to
the venv that holds the pinned ``nki`` (``deploy.provision.remote``), and the plan marks them
UNVERIFIED. The documented way to find the image of one release is its description, which
names the release ("Neuron SDK 2.34.0"): ``describe-images`` by name and description
(https://awsdocs-neuron.readthedocs-hosted.com/en/v2.32.0/deploy/environments/dlami.html,
"Finding a DLAMI for a specific Neuron SDK version").

Older SDKs run the kernels of an older nki_ssm (``OLDER_SDKS``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SdkProfile:
    """One SDK release as its DLAMI ships it."""

    release: str            # Neuron SDK release, as in the AMI description ("Neuron SDK 2.34.0")
    nki: str                # the NKI version of the release
    dlami: str              # the DLAMI's name (images are "<dlami> (<OS>) <date>" or similar)
    image_words: tuple      # words an image name must hold, any case (framework and version)
    ssm_parameters: tuple   # the DLAMI's SSM parameters, tried in order (newest image of each)
    venv: str               # venv on that image holding nki and neuronx-cc
    extra: str              # pyproject extra installed on the host (pins == pip_pins)
    pip_pins: dict          # checked with importlib.metadata before anything compiles
    apt_pins: dict          # checked with dpkg-query
    torch_path: str         # how torch tensors reach the kernels there (nki_ssm/torch/neuron.py)
    unverified: tuple       # names no stored page confirms: the plan says so, launch checks
    sources: tuple          # where the rest comes from


_TORCHNEURON_DLAMI = "Deep Learning AMI Neuron torch-neuronx 2.14.0"
_TORCHNEURON_VENV = "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"
_TORCHNEURON_SSM = tuple(f"/aws/service/neuron/dlami/torch-neuronx-2.14.0/{os}/latest/image_id"
                         for os in ("ubuntu-24.04", "ubuntu-26.04"))
_RTD = "https://awsdocs-neuron.readthedocs-hosted.com/en"


def _torchneuron_release(release: str, nki: str, compiler: str, runtime: str, tools: str,
                         torchneuron: str, extra: str, unverified: tuple, sources: tuple):
    """The profile of a release on the TorchNeuron DLAMI (pins from its release content)."""
    ssm = ("SSM parameter " + _TORCHNEURON_SSM[0] + " (launch tries it, then describe-images "
           f"by name and 'Neuron SDK {release}' in the description)")
    return SdkProfile(
        release=release, nki=nki, dlami=_TORCHNEURON_DLAMI, image_words=("torch-neuronx", "2.14"),
        ssm_parameters=_TORCHNEURON_SSM, venv=_TORCHNEURON_VENV, extra=extra,
        pip_pins={"neuronx-cc": compiler, "nki": nki},
        apt_pins={"aws-neuronx-runtime-lib": runtime, "aws-neuronx-tools": tools},
        torch_path=(f"TorchNeuron {torchneuron} (PyTorch 2.14, device 'neuron'): @nki.jit "
                    "kernels inside the torch.library custom ops, eager and under "
                    "torch.compile(backend=\"neuron\")"),
        unverified=(ssm, *unverified), sources=(f"{_RTD}/v{release}/release-notes/releasecontent.html",
                                                *sources))


SDK_PROFILES = {
    "2.34.0": _torchneuron_release(
        "2.34.0", "0.8.0", "2.29.16866.0", "2.36.8.0", "2.34.29.0", "2.14.3.1", "neuron",
        unverified=(f"image name '{_TORCHNEURON_DLAMI}' and venv {_TORCHNEURON_VENV} in 2.34 "
                    "(documented for 2.33; the host script falls back to the /opt venv holding "
                    "nki 0.8.0)",),
        sources=("https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.34.0",)),
    "2.33.0": _torchneuron_release(
        "2.33.0", "0.7.0", "2.28.7631.0", "2.35.30.0", "2.33.38.0", "2.14.3.0", "neuron-2-33",
        unverified=(), sources=(f"{_RTD}/v2.33.0/setup/pytorch/update-dlami.html",)),
}
DEFAULT_SDK = "2.34.0"
# SDKs before 2.33 (NKI <= 0.6: nl.dynamic_range loops, no nl.if_else) cannot compile this
# release's kernels; the nki_ssm 0.1 line is written for them.
OLDER_SDKS = ("Neuron SDK 2.32 and older (NKI 0.6 and older) need nki_ssm 0.1.x, whose "
              "kernels use the NKI 0.6 front end; deploy/ of that release launches them")


# the release of nki_ssm whose kernels predate NKI 0.8 (registers, no nl.if_else)
LAST_PRE_08_RELEASE = "0.1.0 (git checkout 11f53ce)"


def kernels_refusal(profile: SdkProfile) -> str | None:
    """Why this checkout's kernels cannot compile on ``profile``'s NKI (None: they can): they
    need ``nki_ssm.backend.MIN_NKI``."""
    from nki_ssm.backend import MIN_NKI, MIN_SDK, nki_too_old

    if not nki_too_old(profile.nki):
        return None
    return (f"Neuron SDK {profile.release} has NKI {profile.nki}, and this release's kernels need "
            f"NKI >= {MIN_NKI} (Neuron SDK >= {MIN_SDK}: NkiScalar trip counts, nl.if_else); "
            f"run them on --sdk {MIN_SDK.rsplit('.', 1)[0]}, or use nki_ssm "
            f"{LAST_PRE_08_RELEASE}, the last release before NKI 0.8, with its own deploy/")


def sdk_profile_key(text: str) -> str:
    """``--sdk`` as given ("2.34", "2.34.0") -> the key of SDK_PROFILES; ValueError naming
    what exists (and, for an older release, what to use instead)."""
    t = str(text).strip()
    for key in SDK_PROFILES:
        if t in (key, key.rsplit(".", 1)[0]):
            return key
    parts = t.split(".")
    if len(parts) >= 2 and all(p.isdigit() for p in parts) and (int(parts[0]), int(parts[1])) < (2, 33):
        raise ValueError(f"{t}: {OLDER_SDKS}")
    raise ValueError(f"must be one of {', '.join(SDK_PROFILES)} (or 2.34 / 2.33), got {t!r}")


# the default profile's values under their historical names (the same dict objects)
SDK_RELEASE = SDK_PROFILES[DEFAULT_SDK].release
PIP_PINS = SDK_PROFILES[DEFAULT_SDK].pip_pins
APT_PINS = SDK_PROFILES[DEFAULT_SDK].apt_pins
DLAMI_VENV = SDK_PROFILES[DEFAULT_SDK].venv
DLAMI_OWNER = "amazon"
# describe-images name filter of every Neuron DLAMI (the DLAMI guide's example); the
# profile's image_words pick the framework among them
DLAMI_NAME_FILTER = "Deep Learning AMI Neuron*"
NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
NEURON_TOOLS_BIN = "/opt/aws/neuron/bin"

# Where trn2 is offered. The evidence: moto 5.2.6's offerings data, generated from
# describe-instance-type-offerings answers (moto/ec2/resources/instance_type_offerings),
# lists trn2.3xlarge in sa-east-1 (three zones), ap-southeast-4 (4c) and ap-south-2 (2b),
# trn2.48xlarge in us-east-2 and ap-south-2; aws-neuron/nki-moe#14 finds no trn2.3xlarge in
# US East; teams launch trn2.3xlarge in sa-east-1 and ap-southeast-4 and meet
# InsufficientInstanceCapacity there at times (nki-moe#9); skypilot-org/skypilot#9030 finds
# it in sa-east-1. Default: sa-east-1 + trn2.3xlarge, the cheapest Trainium2 type in a
# region every account has (ap-southeast-4 and ap-south-2 are opt-in). launch checks the
# offering in the region before it creates anything.
OFFERING_EVIDENCE = (
    ("sa-east-1", "trn2.3xlarge",
     "moto 5.2.6 offerings data (zones sa-east-1a/b/c); aws-neuron/nki-moe#9 and #14; "
     "skypilot-org/skypilot#9030"),
    ("ap-southeast-4", "trn2.3xlarge",
     "moto 5.2.6 offerings data (zone ap-southeast-4c); aws-neuron/nki-moe#9 (teams launch "
     "there; InsufficientInstanceCapacity at times); on-demand $2.235/h in a third-party report"),
    ("ap-south-2", "trn2.3xlarge", "moto 5.2.6 offerings data (zone ap-south-2b)"),
    ("us-east-2", "trn2.48xlarge",
     "EC2 Capacity Blocks for ML docs (trn2.48xlarge in us-east-2); moto 5.2.6 offerings data "
     "(zones us-east-2a/b/c); 16 chips: --capacity-reservation-id"),
)
DEFAULT_REGION = "sa-east-1"
DEFAULT_INSTANCE_TYPE = "trn2.3xlarge"
# Opt-in regions: launched after 2019-03-20, disabled on a new account until enabled
# (https://docs.aws.amazon.com/accounts/latest/reference/manage-acct-regions.html; the
# list of https://docs.aws.amazon.com/AmazonS3/latest/userguide/ConfiguringMrapOptInRegions.html
# and the regions opened since). The plan names them; launch asks the account
# (ec2 describe-regions, OptInStatus) before it creates anything.
OPT_IN_REGIONS = frozenset({
    "af-south-1", "ap-east-1", "ap-east-2", "ap-south-2", "ap-southeast-3", "ap-southeast-4",
    "ap-southeast-5", "ap-southeast-6", "ap-southeast-7", "ca-west-1", "eu-central-2",
    "eu-south-1", "eu-south-2", "il-central-1", "me-central-1", "me-south-1", "mx-central-1",
})
# where describe-regions is asked: a region every account has (a disabled region's own
# endpoint refuses the credentials)
REGION_STATUS_ENDPOINT = "us-east-1"


def enable_region_hint(region: str) -> str:
    """How to enable an opt-in region (Account Management: EnableRegion)."""
    return (f"`aws account enable-region --region-name {region}` (minutes, sometimes hours; "
            f"`aws account get-region-opt-status --region-name {region}` says ENABLED when done)")


# families whose types are discovered at run time (describe-instance-types), never listed here
DISCOVERED_FAMILIES = ("trn2", "trn2u", "trn3")
DEFAULT_TTL_HOURS = 4.0
MIN_TTL_HOURS = 0.5           # room for the SSM command's own margins (workflow.run_timeouts)
MAX_TTL_HOURS = 48.0
# "When launching a Trn1/Trn2/Trn3 instance, you must adjust your primary EBS volume size to a
# minimum of 512GB" (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/setup/pytorch/update-dlami.html)
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
