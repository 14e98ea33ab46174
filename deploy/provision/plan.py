"""Request payloads of the provisioning calls, as plain data.

Every AWS request deploy/ makes is built here by a pure function, so the
dry-run prints exactly what a real run sends and the tests assert it. A
:class:`Call` is one API call: service, operation, parameters and why.

AWS rules enforced before any call (so a bad name fails here, not half-way
through a launch):
  * tag keys 1-128 characters, values 0-256, no key starting with ``aws:``
    (reserved for AWS; EC2 and IAM reject it), at most 50 tags per resource;
  * IAM role names 1-64 characters of ``[A-Za-z0-9+=,.@_-]``; instance profile
    names the same set, 1-128; IAM paths ``/.../``;
  * security group names 1-255 characters, not starting with ``sg-``.
"""
from __future__ import annotations

import datetime as _dt
import json
import re
import secrets
from dataclasses import dataclass, field

from deploy import config as C

_IAM_NAME = re.compile(r"^[A-Za-z0-9+=,.@_-]+$")
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_READS = ("describe", "get", "list", "head")


@dataclass
class Call:
    """One AWS API call: ``service.operation(**params)`` and why it is made."""

    service: str
    operation: str
    params: dict = field(default_factory=dict)
    why: str = ""
    creates: bool = False      # makes something that costs or must be torn down
    only_if: str = ""          # made only in this case (empty: always)

    @property
    def kind(self) -> str:
        """"create" (must be torn down), "read" (no side effect) or "write"."""
        if self.creates:
            return "create"
        return "read" if self.operation.startswith(_READS) else "write"

    def render(self) -> str:
        body = json.dumps(self.params, indent=2, sort_keys=True, default=str)
        body = "\n".join("      " + line for line in body.splitlines())
        mark = {"create": "CREATE ", "read": "read   ", "write": "write  "}[self.kind]
        why = f"only if {self.only_if}: {self.why}" if self.only_if else self.why
        return f"  {mark}{self.service}.{self.operation}  # {why}\n{body}"


def new_run_id(now: _dt.datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS-xxxx`` (UTC + 4 random hex digits): names and tags one run."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ValueError(f"run_id must be 1-40 characters of [a-z0-9-] starting with a letter or "
                         f"digit, got {run_id!r}")
    return run_id


def check_tags(tags: list[dict]) -> list[dict]:
    """Tags as AWS accepts them (see the module docstring); returns ``tags``."""
    if len(tags) > 50:
        raise ValueError(f"tags: at most 50 per resource, got {len(tags)}")
    seen = set()
    for t in tags:
        key, value = t.get("Key"), t.get("Value")
        if not isinstance(key, str) or not 1 <= len(key) <= 128:
            raise ValueError(f"tag key must be 1-128 characters, got {key!r}")
        if key.lower().startswith("aws:"):
            raise ValueError(f"tag key {key!r}: the 'aws:' prefix is reserved for AWS")
        if not isinstance(value, str) or len(value) > 256:
            raise ValueError(f"tag {key!r}: value must be a string of at most 256 characters")
        if key in seen:
            raise ValueError(f"tag key {key!r} given twice")
        seen.add(key)
    return tags


def check_iam_name(kind: str, name: str, max_len: int) -> str:
    if not 1 <= len(name) <= max_len or not _IAM_NAME.match(name):
        raise ValueError(f"{kind} name must be 1-{max_len} characters of [A-Za-z0-9+=,.@_-], "
                         f"got {name!r}")
    return name


@dataclass(frozen=True)
class Names:
    """Names of the resources of one run (all derived from the run id)."""

    run_id: str

    @property
    def base(self) -> str:
        return f"{C.PROJECT}-{self.run_id}"

    @property
    def role(self) -> str:
        return check_iam_name("IAM role", self.base, 64)

    @property
    def instance_profile(self) -> str:
        return check_iam_name("instance profile", self.base, 128)

    @property
    def security_group(self) -> str:
        name = self.base
        if name.startswith("sg-") or len(name) > 255:
            raise ValueError(f"security group name {name!r} is not allowed")
        return name

    @property
    def results_prefix(self) -> str:
        return f"{C.RESULTS_PREFIX}/{self.run_id}"


def ttl_expiry(ttl_hours: float, now: _dt.datetime | None = None) -> str:
    """ISO 8601 UTC time at which the run's resources expire."""
    if not 0 < ttl_hours <= C.MAX_TTL_HOURS:
        raise ValueError(f"ttl_hours must be in (0, {C.MAX_TTL_HOURS}], got {ttl_hours}")
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return (now + _dt.timedelta(hours=ttl_hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


def tags(run_id: str, ttl_expires: str, extra: dict | None = None) -> list[dict]:
    """The tags of every resource of the run (EC2 / IAM form: [{"Key", "Value"}])."""
    out = [
        {"Key": "Name", "Value": f"{C.PROJECT}-{run_id}"},
        {"Key": C.TAG_PROJECT, "Value": C.PROJECT},
        {"Key": C.TAG_RUN_ID, "Value": run_id},
        {"Key": C.TAG_TTL_EXPIRES, "Value": ttl_expires},
    ]
    for k, v in (extra or {}).items():
        out.append({"Key": k, "Value": str(v)})
    return check_tags(out)


def trust_policy() -> dict:
    """Only EC2 may assume the role."""
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
        "Action": "sts:AssumeRole"}]}


def results_policy(bucket: str, prefix: str) -> dict:
    """Least privilege for the instance: read and write objects under one S3 prefix, list only it."""
    if not bucket or "/" in bucket:
        raise ValueError(f"bucket must be a bucket name (no '/'), got {bucket!r}")
    prefix = prefix.strip("/")
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "RunObjects", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": f"arn:aws:s3:::{bucket}/{prefix}/*"},
        {"Sid": "RunListing", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": f"arn:aws:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}},
    ]}


def user_data(run_id: str, ttl_hours: float, ttl_expires: str) -> str:
    """Boot script: the on-host TTL timer. Shutdown behaviour is "terminate", so the
    halt at the end of the TTL terminates the instance (and deletes its volume)."""
    minutes = max(1, int(round(ttl_hours * 60)))
    return "\n".join([
        "#!/bin/bash",
        f"# {C.PROJECT} run {run_id}: time to live {minutes} min (expires {ttl_expires}).",
        "# Two independent timers; either halts the host, which terminates it.",
        "set -u",
        f"systemd-run --unit=nki-ssm-bench-ttl --on-active={minutes}m /sbin/shutdown -h now || true",
        f"shutdown -h +{minutes} 'nki-ssm-bench time to live reached' || true",
        f"echo '{ttl_expires}' > /etc/nki-ssm-bench-ttl",
        "",
    ])


def run_instances_params(*, image_id: str, instance_type: str, subnet_id: str,
                         security_group_id: str, instance_profile: str, user_data_script: str,
                         resource_tags: list[dict], root_device: str = "/dev/sda1",
                         root_gb: int = C.ROOT_VOLUME_GB, capacity_reservation_id: str | None = None
                         ) -> dict:
    """The exact RunInstances request: IMDSv2 only, no key pair, no public ports (the
    security group has no ingress rule), terminate on shutdown, tagged, encrypted root."""
    params = {
        "ImageId": image_id,
        "InstanceType": instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "SubnetId": subnet_id,
        "SecurityGroupIds": [security_group_id],
        "IamInstanceProfile": {"Name": instance_profile},
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled",
                            "HttpPutResponseHopLimit": 1, "InstanceMetadataTags": "enabled"},
        "InstanceInitiatedShutdownBehavior": "terminate",
        "UserData": user_data_script,
        "BlockDeviceMappings": [{"DeviceName": root_device, "Ebs": {
            "VolumeSize": root_gb, "VolumeType": "gp3", "DeleteOnTermination": True,
            "Encrypted": True}}],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": resource_tags},
                              {"ResourceType": "volume", "Tags": resource_tags}],
    }
    if capacity_reservation_id:   # an EC2 Capacity Block for ML (README: prerequisites)
        params["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": capacity_reservation_id}}
        params["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    return params


@dataclass
class LaunchSettings:
    """What the user chose (CLI flags), with the defaults of config.py."""

    region: str = C.DEFAULT_REGION
    instance_type: str = C.DEFAULT_INSTANCE_TYPE
    family: str | None = None            # "trn3", "trn2": discover the types of this family
    sdk: str = C.DEFAULT_SDK             # config.SDK_PROFILES key ("2.34" accepted): image, venv, pins
    ami_id: str | None = None            # explicit AMI
    bucket: str = "<your-bucket>"
    ttl_hours: float = C.DEFAULT_TTL_HOURS
    subnet_id: str | None = None
    capacity_reservation_id: str | None = None
    hourly_price: float | None = None
    run_id: str = ""

    def __post_init__(self):
        if not self.run_id:
            self.run_id = new_run_id()
        check_run_id(self.run_id)
        try:
            self.sdk = C.sdk_profile_key(self.sdk)
        except ValueError as exc:
            raise ValueError(f"sdk {exc}") from None
        if not self.instance_type.startswith("<"):   # "<smallest offered trn3 type>": the plan's
            check_instance_type(self.instance_type)   # placeholder before discovery
        ttl_expiry(self.ttl_hours)   # range check

    @property
    def profile(self) -> C.SdkProfile:
        return C.SDK_PROFILES[self.sdk]

    @property
    def target(self) -> str:
        """The compile and cost-model target of the chosen type: trn3 for trn3.*, else trn2."""
        return target_of(self.family or self.instance_type)


_TYPE = re.compile(r"^(" + "|".join(re.escape(f) for f in C.DISCOVERED_FAMILIES) + r")\.[a-z0-9]+$")


def check_instance_type(name: str) -> str:
    """A Trainium instance type name (``trn2.3xlarge``, ``trn3.<size>``, ...), before any call:
    the bench needs a Neuron device, and a typo must not create an IAM role first."""
    if not isinstance(name, str) or not _TYPE.match(name):
        raise ValueError(f"instance type must be a Trainium type of the families "
                         f"{', '.join(C.DISCOVERED_FAMILIES)} (e.g. {C.DEFAULT_INSTANCE_TYPE}), "
                         f"got {name!r}")
    return name


def target_of(type_or_family: str) -> str:
    """NEURON_PLATFORM_TARGET_OVERRIDE / cost-model target of an instance type or family."""
    return "trn3" if type_or_family.split(".")[0] == "trn3" else "trn2"


def image_filters(profile: C.SdkProfile) -> list[dict]:
    """describe-images filters: every Neuron DLAMI by name, the SDK release by description
    (the DLAMI guide's query); framework words, x86_64 and OS are checked on the answer
    (``deploy.provision.discover.pick_image``)."""
    return [{"Name": "name", "Values": [C.DLAMI_NAME_FILTER]},
            {"Name": "description", "Values": [f"*Neuron SDK {profile.release}*"]}]


def region_calls(s: LaunchSettings) -> list[Call]:
    """Whether the account has the region (opt-in regions are disabled on a new account)."""
    return [Call("ec2", "describe_regions", {"AllRegions": True, "RegionNames": [s.region]},
                 f"OptInStatus of {s.region} for this account (asked in "
                 f"{C.REGION_STATUS_ENDPOINT}); 'not-opted-in' stops here, before anything is "
                 "created")]


def ami_calls(s: LaunchSettings) -> list[Call]:
    """How the AMI is found: the DLAMI's SSM parameters in turn (names UNVERIFIED: one that
    does not exist is skipped), each image checked against the profile's release (the AMI
    description names it); else describe-images by name and release."""
    if s.ami_id:
        return [Call("ec2", "describe_images", {"ImageIds": [s.ami_id]}, "the given AMI exists")]
    p = s.profile
    calls = []
    for k, name in enumerate(p.ssm_parameters):
        calls.append(Call("ssm", "get_parameter", {"Name": name},
                          f"newest '{p.dlami}' image (parameter name UNVERIFIED)",
                          only_if="" if k == 0 else "the parameters before name no image of "
                                                    f"SDK {p.release}"))
        calls.append(Call("ec2", "describe_images", {"ImageIds": ["<the parameter's image>"]},
                          f"its description must name 'Neuron SDK {p.release}'; root device",
                          only_if="the parameter exists"))
    calls.append(Call("ec2", "describe_images", {"Owners": [C.DLAMI_OWNER], "Filters": image_filters(p)},
                      f"the newest x86_64 image of SDK {p.release} whose name holds "
                      + " and ".join(repr(w) for w in p.image_words),
                      only_if="no parameter names an image of that release"))
    return calls


def lookup_calls(s: LaunchSettings) -> list[Call]:
    """Every read-only look-up before anything is created, in order."""
    return region_calls(s) + ami_calls(s) + discovery_calls(s)


def discovery_calls(s: LaunchSettings) -> list[Call]:
    """Instance types: a family is listed at run time, never from a table."""
    pattern = f"{s.family}.*" if s.family else s.instance_type
    block = []
    if s.capacity_reservation_id:
        block = [Call("ec2", "describe_capacity_reservations",
                      {"CapacityReservationIds": [s.capacity_reservation_id]},
                      "the block's zone, type, dates and state: the subnet must be in its zone")]
    zones = "<the reservation's zone>" if s.capacity_reservation_id else "<the offering zones>"
    return block + [
        Call("ec2", "describe_instance_types",
             {"Filters": [{"Name": "instance-type", "Values": [pattern]}]},
             "vCPUs, memory, Neuron devices of the type(s)"),
        Call("ec2", "describe_instance_type_offerings",
             {"LocationType": "availability-zone",
              "Filters": [{"Name": "instance-type", "Values": [
                  "<the types listed above>" if s.family else s.instance_type]}]},
             "zones of the region that offer the type(s); none stops here"),
        Call("ec2", "describe_subnets", ({"SubnetIds": [s.subnet_id]} if s.subnet_id else {"Filters": [
            {"Name": "default-for-az", "Values": ["true"]},
            {"Name": "availability-zone", "Values": [zones]}]}),
            "the subnet (default: the default VPC's, in a zone offering the type)"),
        Call("pricing", "get_products", pricing_filters(s.instance_type, s.region),
             "on-demand Linux price per hour (Price List API, us-east-1 endpoint)"),
    ]


def pricing_filters(instance_type: str, region: str) -> dict:
    return {"ServiceCode": "AmazonEC2", "MaxResults": 10, "Filters": [
        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type},
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
        {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
        {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
        {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
        {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"}]}


def create_calls(s: LaunchSettings, *, image_id="<ami>", subnet_id="<subnet in an offering zone>",
                 vpc_id="<default vpc>", sg_id="<sg from create_security_group>",
                 root_device="/dev/sda1", now: _dt.datetime | None = None) -> list[Call]:
    """The calls that create the run's resources, in order, with their exact payloads."""
    names = Names(s.run_id)
    expires = ttl_expiry(s.ttl_hours, now)
    tg = tags(s.run_id, expires)
    prefix = names.results_prefix
    return [
        Call("s3", "head_bucket", {"Bucket": s.bucket}, "the results bucket exists and is reachable"),
        Call("iam", "create_role", {
            "RoleName": names.role, "Path": C.IAM_PATH,
            "AssumeRolePolicyDocument": json.dumps(trust_policy()),
            "Description": f"{C.PROJECT} run {s.run_id}: SSM core + s3://{s.bucket}/{prefix}/",
            "MaxSessionDuration": 3600, "Tags": tg}, "instance role", creates=True),
        Call("iam", "attach_role_policy", {"RoleName": names.role, "PolicyArn": C.SSM_CORE_POLICY_ARN},
             "SSM Run Command without SSH (AmazonSSMManagedInstanceCore)", creates=True),
        Call("iam", "put_role_policy", {
            "RoleName": names.role, "PolicyName": "results-prefix",
            "PolicyDocument": json.dumps(results_policy(s.bucket, prefix))},
            f"only s3://{s.bucket}/{prefix}/*", creates=True),
        Call("iam", "create_instance_profile", {"InstanceProfileName": names.instance_profile,
                                                "Path": C.IAM_PATH, "Tags": tg},
             "instance profile", creates=True),
        Call("iam", "add_role_to_instance_profile", {"InstanceProfileName": names.instance_profile,
                                                     "RoleName": names.role}, "", creates=True),
        Call("ec2", "create_security_group", {
            "GroupName": names.security_group, "VpcId": vpc_id,
            "Description": f"{C.PROJECT} run {s.run_id}: no inbound rules (SSM only)",
            "TagSpecifications": [{"ResourceType": "security-group", "Tags": tg}]},
            "no ingress rule is ever added: no open ports", creates=True),
        Call("ec2", "run_instances", run_instances_params(
            image_id=image_id, instance_type=s.instance_type, subnet_id=subnet_id,
            security_group_id=sg_id, instance_profile=names.instance_profile,
            user_data_script=user_data(s.run_id, s.ttl_hours, expires), resource_tags=tg,
            root_device=root_device, capacity_reservation_id=s.capacity_reservation_id),
            f"the host; terminates itself after {s.ttl_hours:g} h", creates=True),
    ]


def teardown_calls(run_id: str) -> list[Call]:
    """What teardown does, in order (ids and names come from the tag look-ups)."""
    names = Names(run_id)
    by_tag = [{"Name": f"tag:{C.TAG_RUN_ID}", "Values": [run_id]}]
    return [
        Call("ec2", "describe_instances", {"Filters": by_tag + [
            {"Name": "instance-state-name",
             "Values": ["pending", "running", "stopping", "stopped", "shutting-down"]}]},
            "teardown: the run's instances, by tag"),
        Call("ec2", "describe_security_groups", {"Filters": by_tag}, "its security group, by tag"),
        Call("iam", "list_instance_profiles", {"PathPrefix": C.IAM_PATH}, "profiles under the path"),
        Call("iam", "get_instance_profile", {"InstanceProfileName": names.instance_profile},
             "its tags and roles"),
        Call("iam", "list_roles", {"PathPrefix": C.IAM_PATH}, "roles under the path"),
        Call("iam", "list_role_tags", {"RoleName": names.role}, "the role's tags"),
        Call("ec2", "terminate_instances", {"InstanceIds": ["<found>"]},
             "then describe_instances until terminated"),
        Call("ec2", "delete_security_group", {"GroupId": "<found>"}, ""),
        Call("iam", "remove_role_from_instance_profile", {"InstanceProfileName": names.instance_profile,
                                                          "RoleName": names.role}, ""),
        Call("iam", "delete_instance_profile", {"InstanceProfileName": names.instance_profile}, ""),
        Call("iam", "list_attached_role_policies", {"RoleName": names.role}, ""),
        Call("iam", "detach_role_policy", {"RoleName": names.role, "PolicyArn": C.SSM_CORE_POLICY_ARN}, ""),
        Call("iam", "list_role_policies", {"RoleName": names.role}, ""),
        Call("iam", "delete_role_policy", {"RoleName": names.role, "PolicyName": "results-prefix"}, ""),
        Call("iam", "list_instance_profiles_for_role", {"RoleName": names.role},
             "any profile still holding the role"),
        Call("iam", "delete_role", {"RoleName": names.role}, "S3 results are kept"),
    ]
