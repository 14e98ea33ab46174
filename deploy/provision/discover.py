"""Read-only look-ups: the region, the AMI, the instance types of a family, the zones, the price."""
from __future__ import annotations

import json

from deploy import config as C
from deploy.provision.plan import LaunchSettings, image_filters, pricing_filters


def region_status(ec2, region: str) -> str | None:
    """The account's OptInStatus of ``region`` ("opt-in-not-required", "opted-in",
    "not-opted-in"), from describe-regions with AllRegions (a disabled region is listed
    too); None when the region is unknown to the endpoint."""
    got = ec2.describe_regions(AllRegions=True, RegionNames=[region]).get("Regions", [])
    return got[0].get("OptInStatus") if got else None


class RegionNotEnabled(LookupError):
    """The region is an opt-in region the account has not enabled (nothing was created)."""


def check_region(ec2, region: str) -> str:
    """RegionNotEnabled, with the command that enables it, unless the account has ``region``
    -> its status."""
    status = region_status(ec2, region)
    if status == "not-opted-in":
        others = "; ".join(f"--region {r} ({t})" for r, t, _ in C.OFFERING_EVIDENCE
                           if r not in C.OPT_IN_REGIONS)
        raise RegionNotEnabled(f"{region} is an opt-in region this account has not enabled "
                               f"(ec2 describe-regions: {status}); nothing was created. Enable it "
                               f"with {C.enable_region_hint(region)}, or use a region every account "
                               f"has: {others}")
    if status is None:
        raise RegionNotEnabled(f"{region} is not a region this account can see "
                               "(ec2 describe-regions lists no such region); nothing was created")
    return status


def _missing_parameter(exc) -> bool:
    return getattr(exc, "response", {}).get("Error", {}).get("Code") == "ParameterNotFound"


def resolve_ami(ec2, ssm, s: LaunchSettings) -> dict:
    """-> {"ImageId", "Name", "Description", "RootDeviceName", "source", "notes"}.

    An explicit AMI; else the first of the profile's DLAMI SSM parameters that exists and
    holds an image whose description names the profile's release ("Each Neuron DLAMI includes
    the SDK version in its description": the DLAMI guide); else (no such parameter, or it
    moved on to a newer release) the newest x86_64 image of that release whose name holds the
    profile's framework words (``pick_image``). run-instances gets the image id itself, so the
    plan shows what is launched and the pins match the image. LookupError, listing the Neuron
    images of that release, when there is none: before anything is created.
    """
    if s.ami_id:
        images = ec2.describe_images(ImageIds=[s.ami_id])["Images"]
        if not images:
            raise LookupError(f"AMI {s.ami_id} not found in {s.region}")
        return _image(images[0], "given")
    p = s.profile
    want = f"Neuron SDK {p.release}"
    notes = []
    for name in p.ssm_parameters:
        try:
            image_id = ssm.get_parameter(Name=name)["Parameter"]["Value"]
        except Exception as exc:   # the name is UNVERIFIED: a missing one is a note, not an error
            if not _missing_parameter(exc):
                raise
            notes.append(f"SSM parameter {name} does not exist (its name was UNVERIFIED)")
            continue
        images = ec2.describe_images(ImageIds=[image_id])["Images"]
        if images and want in images[0].get("Description", ""):
            return _image(images[0], f"ssm:{name}", notes)
        latest = images[0].get("Description", "?") if images else "no image"
        notes.append(f"SSM parameter {name} holds {image_id} ({latest[:80]}), not {want}")
    found = ec2.describe_images(Owners=[C.DLAMI_OWNER], Filters=image_filters(p))["Images"]
    chosen = pick_image(found, p)
    if chosen is None:
        names = sorted({im.get("Name", "?") for im in found})
        raise LookupError(
            f"no x86_64 '{p.dlami}' image with '{want}' in its description in {s.region} "
            f"({'; '.join(notes) or 'no SSM parameter'}; Neuron images of that release: "
            f"{', '.join(names[:8]) or 'none'}); pass --ami-id or another --sdk "
            f"({', '.join(C.SDK_PROFILES)}); nothing was created")
    words = " and ".join(repr(w) for w in p.image_words)
    return _image(chosen, f"describe-images: name holds {words}, '{want}' in the description", notes)


def pick_image(images: list[dict], profile: C.SdkProfile) -> dict | None:
    """The newest x86_64 image of ``profile``'s release whose name holds its framework words
    (any case), Ubuntu 24.04 before 26.04 before others; None if there is none."""
    want = f"Neuron SDK {profile.release}"
    ok = [im for im in images if im.get("Architecture", "x86_64") == "x86_64"
          and want in im.get("Description", "")
          and all(w.lower() in im.get("Name", "").lower() for w in profile.image_words)]
    order = ("ubuntu 24.04", "ubuntu 26.04")

    def os_rank(im):
        name = im.get("Name", "").lower()
        return next((k for k, o in enumerate(order) if o in name), len(order))

    ok.sort(key=lambda im: im.get("CreationDate", ""), reverse=True)
    ok.sort(key=os_rank)                      # stable: newest first within an OS
    return ok[0] if ok else None


def _image(im: dict, source: str, notes: list | None = None) -> dict:
    return {"ImageId": im["ImageId"], "Name": im.get("Name", ""),
            "Description": im.get("Description", ""),
            "RootDeviceName": im.get("RootDeviceName") or "/dev/sda1", "source": source,
            "notes": list(notes or [])}


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


def elsewhere(instance_type: str | None = None) -> str:
    """Where else trn2 is reported offered (config.OFFERING_EVIDENCE), for error messages."""
    rows = [(r, t, src) for r, t, src in C.OFFERING_EVIDENCE if instance_type in (None, t)]
    return "; ".join(f"{t} in {r}{' (an opt-in region)' if r in C.OPT_IN_REGIONS else ''} ({src})"
                     for r, t, src in rows)


def choose_type(types: list[dict], zones: dict, family: str | None, wanted: str,
                region: str = "this region") -> str:
    """The instance type to launch: ``wanted`` when no family is asked; else the smallest
    offered type of the family (types come from describe-instance-types, not a table).
    LookupError naming where else the type is reported offered when the region has none."""
    if family is None:
        if wanted not in zones:
            where = elsewhere(wanted) or elsewhere()
            raise LookupError(f"{wanted} is not offered in any zone of {region} "
                              f"(describe-instance-type-offerings); try --region: {where}; "
                              "or launch into a capacity block (--capacity-reservation-id)")
        return wanted
    offered = [t["InstanceType"] for t in types if t["InstanceType"] in zones]
    if not offered:
        raise LookupError(f"no {family} instance type is offered in {region}; reported "
                          f"elsewhere: {elsewhere()}")
    return offered[0]


def capacity_block(ec2, reservation_id: str) -> dict:
    """{"zone", "instance_type", "start", "end", "state", "type"} of a capacity reservation
    (type "capacity-block" for a block): the instance must launch in its zone, with its
    type, while it is active."""
    resp = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation_id])
    (cr,) = resp["CapacityReservations"]
    return {"zone": cr["AvailabilityZone"], "instance_type": cr["InstanceType"],
            "start": cr.get("StartDate"), "end": cr.get("EndDate"), "state": cr.get("State"),
            "type": cr.get("ReservationType", "")}


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


def reference_price(instance_type: str, region: str) -> tuple[float | None, str]:
    """(price, source) from config.REFERENCE_PRICES_USD: used only without credentials."""
    return C.REFERENCE_PRICES_USD.get((instance_type, region),
                                      (None, f"no reference figure for {instance_type} in {region}"))


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


def subnet_vpc(ec2, subnet_id: str) -> tuple[str, str, str]:
    """(subnet id, vpc id, availability zone) of a given subnet."""
    sn = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]
    return sn["SubnetId"], sn["VpcId"], sn["AvailabilityZone"]
