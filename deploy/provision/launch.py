"""Create the run's resources in plan order; on any failure, tear down what was made.

The payloads are those of :func:`deploy.provision.plan.create_calls`; this
module only fills in what the earlier calls returned (the security group id)
and retries RunInstances while a new instance profile propagates through IAM.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

from deploy.provision import plan as P
from deploy.provision import teardown as T

# IAM is eventually consistent: a fresh instance profile can be unknown to EC2 for a while
_PROFILE_NOT_READY = "InvalidParameterValue"


@dataclass
class Launched:
    run_id: str
    instance_id: str
    instance_type: str
    image_id: str
    security_group_id: str
    instance_profile: str
    role: str
    results_prefix: str


def _run_instances(ec2, params: dict, attempts: int = 12, delay: float = 5.0) -> dict:
    for k in range(attempts):
        try:
            return ec2.run_instances(**params)
        except Exception as exc:
            err = getattr(exc, "response", {}).get("Error", {})
            if (err.get("Code") == _PROFILE_NOT_READY and "instance profile" in err.get("Message", "").lower()
                    and k < attempts - 1):
                time.sleep(delay)
                continue
            raise


def _head_bucket(s3, s: P.LaunchSettings) -> None:
    """The results bucket exists and is the caller's (LookupError saying how to make it)."""
    try:
        s3.head_bucket(Bucket=s.bucket)
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        if code not in ("404", "NoSuchBucket", "403", "AccessDenied"):
            raise
        raise LookupError(f"bucket {s.bucket}: {'not found' if code in ('404', 'NoSuchBucket') else 'not yours'} "
                          f"(head-bucket: {code}); create one with `aws s3 mb s3://<a new name> "
                          f"--region {s.region}` and pass --bucket; nothing was created") from None


def create(clients: dict, s: P.LaunchSettings, *, image_id: str, subnet_id: str, vpc_id: str,
           root_device: str = "/dev/sda1", log=print, retry_delay: float = 5.0) -> Launched:
    """Make every call of ``create_calls`` in order. Any exception: tear down everything
    tagged with the run id (whatever got created), then re-raise."""
    calls = P.create_calls(s, image_id=image_id, subnet_id=subnet_id, vpc_id=vpc_id,
                           root_device=root_device)
    names = P.Names(s.run_id)
    sg_id = instance_id = None
    try:
        for call in calls:
            params = copy.deepcopy(call.params)
            log(f"{call.service}.{call.operation}")
            cl = clients[call.service]
            if call.operation == "run_instances":
                params["SecurityGroupIds"] = [sg_id]
                resp = _run_instances(cl, params, delay=retry_delay)
                instance_id = resp["Instances"][0]["InstanceId"]
            elif call.operation == "head_bucket":
                _head_bucket(cl, s)
            else:
                resp = getattr(cl, call.operation)(**params)
                if call.operation == "create_security_group":
                    sg_id = resp["GroupId"]
    except BaseException:
        log(f"launch failed; tearing down everything tagged {s.run_id}")
        try:
            found = T.find(clients["ec2"], clients["iam"], s.run_id)
            T.teardown(clients["ec2"], clients["iam"], found, log=log, delay=retry_delay)
        except Exception as exc:  # keep the launch's own error the one raised
            log(f"TEARDOWN INCOMPLETE ({exc}); run `python -m deploy teardown --run-id {s.run_id}` "
                "(the instance, if any, still ends itself at its TTL)")
        raise
    return Launched(s.run_id, instance_id, s.instance_type, image_id, sg_id,
                    names.instance_profile, names.role, names.results_prefix)
