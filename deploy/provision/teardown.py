"""Find every resource of a run by its tags, and delete it.

Instances are found by the ``nki-ssm:run-id`` tag (``describe_instances``
with a tag filter), security groups the same way, the IAM role and instance
profile under the ``/nki-ssm-bench/`` path by their tags. Results in S3 are
kept (they are what the run was for). ``expired=True`` selects every run
whose ``nki-ssm:ttl-expires`` tag lies in the past, whatever its run id.
"""
from __future__ import annotations

import datetime as _dt
import time
from dataclasses import asdict, dataclass, field

from deploy import config as C

_LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


@dataclass
class Found:
    instances: list = field(default_factory=list)        # instance ids
    security_groups: list = field(default_factory=list)  # group ids
    instance_profiles: list = field(default_factory=list)
    roles: list = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.instances or self.security_groups or self.instance_profiles or self.roles)

    def to_dict(self) -> dict:
        return asdict(self)


def _tag_map(tags) -> dict:
    return {t["Key"]: t["Value"] for t in tags or []}


def _selected(tags: dict, run_id: str | None, expired: bool, now: str) -> bool:
    if tags.get(C.TAG_PROJECT) != C.PROJECT:
        return False
    if run_id is not None and tags.get(C.TAG_RUN_ID) != run_id:
        return False
    if expired and not tags.get(C.TAG_TTL_EXPIRES, "9999") <= now:
        return False
    return True


def _iam_pages(method, key: str, **kw):
    """Every item of a paginated IAM listing (``IsTruncated`` / ``Marker``)."""
    while True:
        resp = method(**kw)
        yield from resp.get(key, [])
        if not resp.get("IsTruncated"):
            return
        kw["Marker"] = resp["Marker"]


def find(ec2, iam, run_id: str | None = None, *, expired: bool = False) -> Found:
    """Everything of run ``run_id`` (or of every expired run) that still exists."""
    if run_id is None and not expired:
        raise ValueError("find needs a run_id or expired=True (never everything by accident)")
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    key_filter = ({"Name": f"tag:{C.TAG_RUN_ID}", "Values": [run_id]} if run_id
                  else {"Name": "tag-key", "Values": [C.TAG_RUN_ID]})
    found = Found()
    resp = ec2.describe_instances(Filters=[key_filter, {"Name": "instance-state-name",
                                                        "Values": _LIVE_STATES}])
    for res in resp.get("Reservations", []):
        for inst in res.get("Instances", []):
            if _selected(_tag_map(inst.get("Tags")), run_id, expired, now):
                found.instances.append(inst["InstanceId"])
    for sg in ec2.describe_security_groups(Filters=[key_filter]).get("SecurityGroups", []):
        if _selected(_tag_map(sg.get("Tags")), run_id, expired, now):
            found.security_groups.append(sg["GroupId"])
    for prof in _iam_pages(iam.list_instance_profiles, "InstanceProfiles", PathPrefix=C.IAM_PATH):
        name = prof["InstanceProfileName"]
        # GetInstanceProfile returns the tags (listings may omit them)
        tags = _tag_map(prof.get("Tags") or iam.get_instance_profile(
            InstanceProfileName=name)["InstanceProfile"].get("Tags"))
        if _selected(tags, run_id, expired, now):
            found.instance_profiles.append(name)
    for role in _iam_pages(iam.list_roles, "Roles", PathPrefix=C.IAM_PATH):
        name = role["RoleName"]
        tags = _tag_map(iam.list_role_tags(RoleName=name).get("Tags"))
        if _selected(tags, run_id, expired, now):
            found.roles.append(name)
    return found


def _retry(fn, what: str, attempts: int = 30, delay: float = 5.0, codes=("DependencyViolation",)):
    """Call ``fn`` until it stops failing with one of ``codes`` (e.g. a security group still
    attached to an instance that is shutting down)."""
    for k in range(attempts):
        try:
            return fn()
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if code not in codes or k == attempts - 1:
                raise RuntimeError(f"{what}: {exc}") from exc
            time.sleep(delay)


def teardown(ec2, iam, found: Found, *, wait: bool = True, log=print, delay: float = 5.0) -> Found:
    """Delete what ``find`` found: terminate instances (and wait), delete security groups,
    empty and delete instance profiles, detach / delete role policies and roles.
    Returns what was deleted. Every step runs even when an earlier one failed; the
    first failure is raised at the end."""
    done, errors = Found(), []

    def step(fn, what):
        try:
            fn()
            return True
        except Exception as exc:  # keep tearing down the rest
            errors.append(f"{what}: {exc}")
            log(f"  failed: {what}: {exc}")
            return False

    if found.instances:
        log(f"  terminate {', '.join(found.instances)}")
        if step(lambda: ec2.terminate_instances(InstanceIds=found.instances), "terminate"):
            done.instances = list(found.instances)
            if wait:
                step(lambda: ec2.get_waiter("instance_terminated").wait(
                    InstanceIds=found.instances, WaiterConfig={"Delay": 10, "MaxAttempts": 60}),
                    "wait for termination")
    for sg in found.security_groups:
        log(f"  delete security group {sg}")
        if step(lambda sg=sg: _retry(lambda: ec2.delete_security_group(GroupId=sg), sg, delay=delay),
                f"security group {sg}"):
            done.security_groups.append(sg)
    for name in found.instance_profiles:
        log(f"  delete instance profile {name}")

        def drop_profile(name=name):
            prof = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
            for role in prof.get("Roles", []):
                iam.remove_role_from_instance_profile(InstanceProfileName=name,
                                                      RoleName=role["RoleName"])
            iam.delete_instance_profile(InstanceProfileName=name)
        if step(drop_profile, f"instance profile {name}"):
            done.instance_profiles.append(name)
    for name in found.roles:
        log(f"  delete role {name}")

        def drop_role(name=name):
            for p in iam.list_attached_role_policies(RoleName=name).get("AttachedPolicies", []):
                iam.detach_role_policy(RoleName=name, PolicyArn=p["PolicyArn"])
            for p in iam.list_role_policies(RoleName=name).get("PolicyNames", []):
                iam.delete_role_policy(RoleName=name, PolicyName=p)
            for prof in iam.list_instance_profiles_for_role(RoleName=name).get("InstanceProfiles", []):
                iam.remove_role_from_instance_profile(
                    InstanceProfileName=prof["InstanceProfileName"], RoleName=name)
            iam.delete_role(RoleName=name)
        if step(drop_role, f"role {name}"):
            done.roles.append(name)
    if errors:
        raise RuntimeError("teardown incomplete: " + "; ".join(errors))
    return done
