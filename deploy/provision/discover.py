"""Read-only look-ups: the AMI, the instance types of a family, the zones, the price."""
from __future__ import annotations

import json

from deploy import config as C
from deploy.provision.plan import LaunchSettings, pricing_filters


def resolve_ami(ec2, ssm, s: LaunchSettings) -> dict:
    """-> {"ImageId", "Name", "Description", "RootDeviceName", "source"}.

    An explicit AMI, the newest DLAMI whose description names the pinned SDK
    release, or the DLAMI SSM parameter (resolved here: run-instances gets
    the image id itself, so the plan shows what is launched).
    """
    if s.ami_id:
        images = ec2.describe_images(ImageIds=[s.ami_id])["Images"]
        source = "given"
    elif s.sdk_release:
        images = ec2.describe_images(
            Owners=[C.DLAMI_OWNER],
            Filters=[{"Name": "name", "Values": [C.DLAMI_NAME_PATTERN]},
                     {"Name": "description", "Values": [f"*Neuron SDK {s.sdk_release}*"]}])["Images"]
        images = [im for im in images if im.get("Architecture", "x86_64") == "x86_64"]
        images.sort(key=lambda im: im.get("CreationDate", ""), reverse=True)
        source = f"describe-images, Neuron SDK {s.sdk_release}"
        if not images:
            raise LookupError(f"no Neuron DLAMI with 'Neuron SDK {s.sdk_release}' in its description "
                              f"in {s.region}")
    else:
        name = C.DLAMI_SSM_PARAMETERS[s.dlami]
        image_id = ssm.get_parameter(Name=name)["Parameter"]["Value"]
        images = ec2.describe_images(ImageIds=[image_id])["Images"]
        source = f"ssm:{name}"
    if not images:
        raise LookupError(f"AMI not found ({source})")
    im = images[0]
    return {"ImageId": im["ImageId"], "Name": im.get("Name", ""),
            "Description": im.get("Description", ""),
            "RootDeviceName": im.get("RootDeviceName") or "/dev/sda1", "source": source}


def _pages(method, key, **kw):
    while True:
        resp = method(**kw)
        yield from resp.get(key, [])
        token = resp.get("NextToken")
        if not token:
            return
        kw["NextToken"] = token


def instance_types(ec2, pattern: str) -> list[dict]:
    """describe-instance-types for ``pattern`` (e.g. ``trn3.*``): name, vCPUs, memory,
    Neuron devices and cores per device, EFA; sorted by vCPUs."""
    out = []
    for t in _pages(ec2.describe_instance_types, "InstanceTypes",
                    Filters=[{"Name": "instance-type", "Values": [pattern]}]):
        neuron = t.get("NeuronInfo") or {}
        devices = neuron.get("NeuronDevices") or []
        out.append({
            "InstanceType": t["InstanceType"],
            "vcpus": t.get("VCpuInfo", {}).get("DefaultVCpus"),
            "memory_mib": t.get("MemoryInfo", {}).get("SizeInMiB"),
            "neuron_devices": sum(d.get("Count", 0) for d in devices),
            "neuron_device": devices[0].get("Name") if devices else None,
            "cores_per_device": (devices[0].get("CoreInfo") or {}).get("Count") if devices else None,
            "efa": t.get("NetworkInfo", {}).get("EfaSupported", False),
        })
    return sorted(out, key=lambda d: (d["vcpus"] or 0, d["InstanceType"]))


def offerings(ec2, names: list[str]) -> dict[str, list[str]]:
    """{instance type: [availability zones of the client's region offering it]} for the
    exact type names (those describe-instance-types listed)."""
    zones: dict[str, list[str]] = {}
    if not names:
        return zones
    for o in _pages(ec2.describe_instance_type_offerings, "InstanceTypeOfferings",
                    LocationType="availability-zone",
                    Filters=[{"Name": "instance-type", "Values": list(names)}]):
        zones.setdefault(o["InstanceType"], []).append(o["Location"])
    return {k: sorted(v) for k, v in zones.items()}


def choose_type(types: list[dict], zones: dict, family: str | None, wanted: str) -> str:
    """The instance type to launch: ``wanted`` when no family is asked; else the smallest
    offered type of the family (types come from describe-instance-types, not a table)."""
    if family is None:
        if wanted not in zones:
            raise LookupError(f"{wanted} is not offered in any zone of this region "
                              f"(describe-instance-type-offerings)")
        return wanted
    offered = [t["InstanceType"] for t in types if t["InstanceType"] in zones]
    if not offered:
        raise LookupError(f"no {family} instance type is offered in this region")
    return offered[0]


def hourly_price(pricing, instance_type: str, region: str) -> float | None:
    """On-demand Linux USD per hour from the Price List API (None when not listed)."""
    resp = pricing.get_products(**pricing_filters(instance_type, region))
    for item in resp.get("PriceList", []):
        product = json.loads(item) if isinstance(item, str) else item
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is not None and float(usd) > 0:
                    return float(usd)
    return None


def reference_price(instance_type: str) -> tuple[float | None, str]:
    """(price, source) from config.REFERENCE_PRICES_USD: used only without credentials."""
    price, source = C.REFERENCE_PRICES_USD.get(instance_type, (None, "no reference figure"))
    return price, source


def default_subnet(ec2, zones: list[str]) -> tuple[str, str]:
    """(subnet id, vpc id): a default-VPC subnet in one of ``zones`` that maps public IPs
    (the SSM agent and S3 need outbound HTTPS; nothing inbound is opened)."""
    subnets = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]},
                                            {"Name": "availability-zone", "Values": zones}])["Subnets"]
    subnets.sort(key=lambda sn: (not sn.get("MapPublicIpOnLaunch", False), sn["AvailabilityZone"]))
    if not subnets:
        raise LookupError(f"no default subnet in the zones offering the type ({', '.join(zones)}); "
                          "pass --subnet-id (a subnet with outbound HTTPS: public IP or NAT / VPC "
                          "endpoints for ssm, ssmmessages, ec2messages and s3)")
    return subnets[0]["SubnetId"], subnets[0]["VpcId"]


def subnet_vpc(ec2, subnet_id: str) -> tuple[str, str]:
    sn = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]
    return sn["SubnetId"], sn["VpcId"]
