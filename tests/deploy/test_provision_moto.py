"""Provisioning against moto: exact RunInstances payload, create -> find by tag -> teardown,
teardown after a failure mid-run, discovery of types / AMIs / price, credentials first."""
from __future__ import annotations

import datetime as _dt
import json

import pytest

from deploy import config as C
from deploy import workflow as W
from deploy.provision import launch as L
from deploy.provision import plan as P
from deploy.provision import teardown as T

from moto_env import BUCKET, REGION, register_dlami, seed_reserved_parameter

NOW = _dt.datetime(2026, 11, 24, 12, 0, 0, tzinfo=_dt.timezone.utc)


def _settings(**kw):
    kw.setdefault("run_id", "20261124-120000-beef")
    return P.LaunchSettings(region=REGION, bucket=BUCKET, **kw)


def _recording(client, operation):
    """Wrap ``client.<operation>`` to record the exact keyword arguments it is sent."""
    sent = []
    real = getattr(client, operation)

    def rec(**params):
        sent.append(json.loads(json.dumps(params)))
        return real(**params)

    setattr(client, operation, rec)
    return sent


def test_reserved_names_are_refused_as_by_aws(aws):
    # the DLAMI parameter lives under /aws/: AWS (and moto) refuse PutParameter there
    with pytest.raises(Exception, match="reserved parameter name|AccessDenied"):
        aws.clients["ssm"].put_parameter(Name="/aws/service/neuron/dlami/x/latest/image_id",
                                         Value="ami-1", Type="String")
    # moto accepts reserved tag keys and over-long IAM names that AWS refuses: deploy checks
    # them itself, before any call, so a bad name never fails half-way through a launch
    with pytest.raises(ValueError, match="'aws:' prefix is reserved"):
        P.check_tags([{"Key": "aws:cloudformation:stack-name", "Value": "x"}])
    with pytest.raises(ValueError, match="1-128"):
        P.check_tags([{"Key": "k" * 129, "Value": "x"}])
    with pytest.raises(ValueError, match="at most 256"):
        P.check_tags([{"Key": "k", "Value": "v" * 257}])
    with pytest.raises(ValueError, match="IAM role name"):
        P.check_iam_name("IAM role", "x" * 65, 64)
    with pytest.raises(ValueError, match="IAM role name"):
        P.check_iam_name("IAM role", "has space", 64)
    with pytest.raises(ValueError, match="run_id"):
        P.check_run_id("Run_With_Upper")
    with pytest.raises(ValueError, match="ttl_hours"):
        P.ttl_expiry(C.MAX_TTL_HOURS + 1)


def test_run_instances_payload_is_exact(aws):
    s = _settings(ttl_hours=2)
    r = W.resolve(aws.clients, s)
    sent = _recording(aws.clients["ec2"], "run_instances")
    got = L.create(aws.clients, s, image_id=r.image["ImageId"], subnet_id=r.subnet_id,
                   vpc_id=r.vpc_id, log=lambda *_: None, retry_delay=0)
    (params,) = sent
    expires = params["TagSpecifications"][0]["Tags"][3]["Value"]
    tags = [{"Key": "Name", "Value": "nki-ssm-bench-20261124-120000-beef"},
            {"Key": "nki-ssm:project", "Value": "nki-ssm-bench"},
            {"Key": "nki-ssm:run-id", "Value": "20261124-120000-beef"},
            {"Key": "nki-ssm:ttl-expires", "Value": expires}]
    assert params == {
        "ImageId": aws.ami,
        "InstanceType": "trn2.3xlarge",
        "MinCount": 1, "MaxCount": 1,
        "SubnetId": r.subnet_id,
        "SecurityGroupIds": [got.security_group_id],
        "IamInstanceProfile": {"Name": "nki-ssm-bench-20261124-120000-beef"},
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled",
                            "HttpPutResponseHopLimit": 1, "InstanceMetadataTags": "enabled"},
        "InstanceInitiatedShutdownBehavior": "terminate",
        "UserData": P.user_data(s.run_id, 2, expires),
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {
            "VolumeSize": 512, "VolumeType": "gp3", "DeleteOnTermination": True, "Encrypted": True}}],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                              {"ResourceType": "volume", "Tags": tags}],
    }
    assert "KeyName" not in params
    ttl = _dt.datetime.strptime(expires, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc)
    assert abs((ttl - _dt.datetime.now(_dt.timezone.utc)).total_seconds() - 2 * 3600) < 120
    assert "--on-active=120m /sbin/shutdown -h now" in params["UserData"]
    assert "shutdown -h +120" in params["UserData"]


def _op_log(clients):
    """Operation names (snake_case) every client sends, in order (botocore event hook)."""
    import re

    sent = []

    def hook(model, **_):
        sent.append(re.sub(r"(?<!^)(?=[A-Z])", "_", model.name).lower())

    for cl in clients.values():
        cl.meta.events.register("before-call.*.*", hook)
    return sent


def test_create_find_by_tag_teardown(aws):
    s = _settings()
    sent = _op_log(aws.clients)
    r = W.resolve(aws.clients, s)
    # the read-only look-ups are those the plan prints, in its order (no pricing client under
    # moto; the first SSM parameter exists here and names an image of the release, so the
    # second parameter and the by-name image search are not needed)
    assert sent == ["describe_regions", "get_parameter", "describe_images", "describe_instance_types",
                    "describe_instance_type_offerings", "describe_subnets"]
    planned = iter(c.operation for c in P.lookup_calls(s))
    assert all(op in planned for op in sent)            # a subsequence of the plan's calls
    assert r.image["ImageId"] == aws.ami and r.image["source"].startswith("ssm:/aws/service/neuron/")
    sent.clear()
    got = L.create(aws.clients, s, image_id=r.image["ImageId"], subnet_id=r.subnet_id,
                   vpc_id=r.vpc_id, log=lambda *_: None, retry_delay=0)
    # exactly the calls the plan prints, in its order
    assert sent == [c.operation for c in P.create_calls(s)]
    sent.clear()
    ec2, iam = aws.clients["ec2"], aws.clients["iam"]
    inst = ec2.describe_instances(InstanceIds=[got.instance_id])["Reservations"][0]["Instances"][0]
    assert inst["MetadataOptions"]["HttpTokens"] == "required" and "KeyName" not in inst
    assert inst["IamInstanceProfile"]["Arn"].endswith(f"{C.IAM_PATH}{got.instance_profile}")
    sg = ec2.describe_security_groups(GroupIds=[got.security_group_id])["SecurityGroups"][0]
    assert sg["IpPermissions"] == []                                   # no open port
    attached = iam.list_attached_role_policies(RoleName=got.role)["AttachedPolicies"]
    assert [p["PolicyArn"] for p in attached] == [C.SSM_CORE_POLICY_ARN]
    doc = iam.get_role_policy(RoleName=got.role, PolicyName="results-prefix")["PolicyDocument"]
    doc = json.loads(doc) if isinstance(doc, str) else doc
    resources = {st["Resource"] for st in doc["Statement"]}
    assert resources == {f"arn:aws:s3:::{BUCKET}/nki-ssm-bench/{s.run_id}/*", f"arn:aws:s3:::{BUCKET}"}
    # another run's resources are not found
    other = _settings(run_id="20261124-130000-cafe")
    L.create(aws.clients, other, image_id=aws.ami, subnet_id=r.subnet_id, vpc_id=r.vpc_id,
             log=lambda *_: None, retry_delay=0)
    found = T.find(ec2, iam, s.run_id)
    assert found.instances == [got.instance_id]
    assert found.security_groups == [got.security_group_id]
    assert found.instance_profiles == [got.instance_profile] and found.roles == [got.role]
    sent.clear()
    found = T.find(ec2, iam, s.run_id)
    T.teardown(ec2, iam, found, log=lambda *_: None, delay=0)
    planned = [c.operation for c in P.teardown_calls(s.run_id)]
    assert set(sent) == set(planned)            # the plan lists every call teardown makes
    assert T.find(ec2, iam, s.run_id).empty()
    state = ec2.describe_instances(InstanceIds=[got.instance_id])["Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] == "terminated"
    assert not T.find(ec2, iam, other.run_id).empty()                 # untouched
    with pytest.raises(ValueError, match="run_id or expired"):
        T.find(ec2, iam, None)


def test_teardown_runs_after_a_failure_mid_run(aws, monkeypatch, tmp_path):
    from deploy.provision import remote as R

    def agent_never_online(*a, **k):
        raise TimeoutError("the SSM agent never came online")

    monkeypatch.setattr(R, "wait_online", agent_never_online)
    s = _settings()
    with pytest.raises(TimeoutError, match="never came online"):
        W.run_all(aws.clients, s, bench_args=["--set", "smoke"], reports_dir=tmp_path,
                  log=lambda *_: None, retry_delay=0, poll_s=0)
    ec2, iam = aws.clients["ec2"], aws.clients["iam"]
    assert T.find(ec2, iam, s.run_id).empty()
    insts = ec2.describe_instances(Filters=[{"Name": f"tag:{C.TAG_RUN_ID}", "Values": [s.run_id]}])
    (inst,) = [i for res in insts["Reservations"] for i in res["Instances"]]
    assert inst["State"]["Name"] == "terminated"
    # the source had been uploaded before the failure; results in S3 are kept
    keys = [o["Key"] for o in aws.clients["s3"].list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == [f"nki-ssm-bench/{s.run_id}/src/nki-ssm-src.tar.gz"]


def test_failed_launch_removes_what_it_created(aws):
    s = _settings()
    r = W.resolve(aws.clients, s)
    ec2 = aws.clients["ec2"]

    def refuse(**params):
        from botocore.exceptions import ClientError

        raise ClientError({"Error": {"Code": "InsufficientInstanceCapacity",
                                     "Message": "no trn2.3xlarge capacity"}}, "RunInstances")

    ec2.run_instances = refuse
    with pytest.raises(Exception, match="InsufficientInstanceCapacity"):
        L.create(aws.clients, s, image_id=r.image["ImageId"], subnet_id=r.subnet_id, vpc_id=r.vpc_id,
                 log=lambda *_: None, retry_delay=0)
    assert T.find(ec2, aws.clients["iam"], s.run_id).empty()   # role, profile, SG: all gone


def test_one_command_collects_reports_and_tears_down(aws, monkeypatch, tmp_path):
    from deploy.provision import remote as R

    monkeypatch.setattr(R, "wait_online", lambda *a, **k: None)
    s = _settings()
    ssm, s3 = aws.clients["ssm"], aws.clients["s3"]
    real_send = ssm.send_command
    fabricated = json.loads((_data() / "results_fabricated.json").read_text())

    def send(**params):
        # what the host does at the end of the command: results to the run's prefix
        assert params["DocumentName"] == "AWS-RunShellScript"
        # exactly the script `python -m deploy host-script` prints (and the dash tests run)
        assert params["Parameters"]["commands"] == W.host_commands(s, ["--set", "smoke"])
        prefix = params["OutputS3KeyPrefix"].rsplit("/", 1)[0]
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/results/results.json", Body=json.dumps(fabricated))
        return real_send(**params)

    ssm.send_command = send
    out = W.run_all(aws.clients, s, bench_args=["--set", "smoke"], reports_dir=tmp_path,
                    log=lambda *_: None, retry_delay=0, poll_s=0)
    assert out["status"] == "Success"
    assert (tmp_path / s.run_id / "results.json").is_file()
    assert (tmp_path / s.run_id / "report.md").is_file()
    assert T.find(aws.clients["ec2"], aws.clients["iam"], s.run_id).empty()


def _data():
    from pathlib import Path

    return Path(__file__).parent / "data"


def test_family_types_are_discovered(aws):
    s = _settings(family="trn2")
    r = W.resolve(aws.clients, s, need_subnet=False)
    names = [t["InstanceType"] for t in r.family_types]
    assert {"trn2.3xlarge", "trn2.48xlarge"} <= set(names)
    assert r.instance_type == "trn2.3xlarge" == s.instance_type      # smallest offered
    assert r.type_info["neuron_device"] == "Trainium2" and r.type_info["cores_per_device"] == 8
    with pytest.raises(LookupError, match="no trn3 instance type is offered"):
        W.resolve(aws.clients, _settings(family="trn3"), need_subnet=False)
    with pytest.raises(LookupError, match="not offered"):
        W.resolve(aws.clients, _settings(instance_type="trn2u.48xlarge"), need_subnet=False)


def test_ami_follows_the_sdk_profile(aws, monkeypatch):
    """The SSM parameter's image when its description names the profile's release; else (the
    parameter does not exist: its name is UNVERIFIED; or it moved on to another release) the
    newest TorchNeuron DLAMI of that release by name; JAX, vLLM, multi-framework and other
    releases' images never match; no image at all: a LookupError naming what exists."""
    monkeypatch.setattr(C, "DLAMI_OWNER", "self")   # moto registers images in the test account
    ec2, ssm = aws.clients["ec2"], aws.clients["ssm"]
    r = W.resolve(aws.clients, _settings(), need_subnet=False)
    assert r.image["ImageId"] == aws.ami and r.image["source"].startswith("ssm:") and not r.notes

    # SDK 2.33: no 2.33 image behind the parameter (it holds 2.34's), so describe-images runs
    old = register_dlami(ec2, release="2.33.0", date="20261019")
    for words in ("JAX 0.10", "PyTorch Inference vLLM 0.29.0.1.2.0", "torch-neuronx 2.13.0"):
        register_dlami(ec2, release="2.33.0", words=words)
    register_dlami(ec2, release="2.33.0", os_name="Amazon Linux 2023", words="JAX 0.10")
    r = W.resolve(aws.clients, _settings(sdk="2.33"), need_subnet=False)
    assert r.image["ImageId"] == old and "Neuron SDK 2.33.0" in r.image["Description"]
    assert r.image["source"].startswith("describe-images: name holds 'torch-neuronx' and '2.14'")
    assert any("holds " + aws.ami in n and "not Neuron SDK 2.33.0" in n for n in r.notes)

    # the parameter does not exist at all (its name is a guess): a note, then describe-images
    name = C.SDK_PROFILES["2.34.0"].ssm_parameters[0]
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import ssm_backends

    del ssm_backends[DEFAULT_ACCOUNT_ID][REGION]._parameters[name]
    with pytest.raises(Exception, match="ParameterNotFound"):
        ssm.get_parameter(Name=name)
    newer = register_dlami(ec2, release="2.34.0", os_name="Ubuntu 26.04", date="20261202")
    r = W.resolve(aws.clients, _settings(), need_subnet=False)
    assert r.image["ImageId"] == aws.ami            # Ubuntu 24.04 before 26.04
    assert any(f"SSM parameter {name} does not exist" in n for n in r.notes)
    assert newer != aws.ami

    # nothing of that release: stop before anything is created, naming what there is
    ec2.deregister_image(ImageId=old)
    with pytest.raises(LookupError) as exc:
        W.resolve(aws.clients, _settings(sdk="2.33"), need_subnet=False)
    msg = str(exc.value)
    assert "no x86_64 'Deep Learning AMI Neuron torch-neuronx 2.14.0' image with 'Neuron SDK 2.33.0'" in msg
    assert "Deep Learning AMI Neuron JAX 0.10 (Ubuntu 24.04) 20261130" in msg
    assert "--ami-id" in msg and "nothing was created" in msg
    with pytest.raises(ValueError, match="sdk must be one of"):
        _settings(sdk="2.35.0")


def test_price_from_the_price_list_api():
    boto3 = pytest.importorskip("boto3")
    from botocore.stub import Stubber

    pricing = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x",
                           aws_secret_access_key="x")
    product = {"product": {"attributes": {"instanceType": "trn2.3xlarge"}}, "terms": {"OnDemand": {
        "T1": {"priceDimensions": {"D1": {"unit": "Hrs", "pricePerUnit": {"USD": "2.2350000000"}}}}}}}
    s = _settings()
    with Stubber(pricing) as stub:
        stub.add_response("get_products", {"PriceList": [json.dumps(product)]},
                          P.pricing_filters("trn2.3xlarge", REGION))
        assert W.price({"pricing": pricing}, s) == (2.235, f"AWS Price List API, on-demand Linux, {REGION}")
    assert W.price(None, _settings(hourly_price=9.5)) == (9.5, "--hourly-price")
    value, source = W.price(None, s)          # no figure for the default region without credentials
    assert value is None and "no reference figure for trn2.3xlarge in sa-east-1" in source
    s4 = P.LaunchSettings(region="ap-southeast-4", bucket=BUCKET, run_id="r1")
    value, source = W.price(None, s4)
    assert value == C.REFERENCE_PRICES_USD[("trn2.3xlarge", "ap-southeast-4")][0] and "unverified" in source


def test_expired_runs_are_found_by_their_ttl_tag(aws):
    s = _settings()
    r = W.resolve(aws.clients, s)
    got = L.create(aws.clients, s, image_id=aws.ami, subnet_id=r.subnet_id, vpc_id=r.vpc_id,
                   log=lambda *_: None, retry_delay=0)
    ec2, iam = aws.clients["ec2"], aws.clients["iam"]
    assert T.find(ec2, iam, expired=True).empty()                       # TTL in the future
    past = [{"Key": C.TAG_TTL_EXPIRES, "Value": "2020-01-01T00:00:00Z"}]
    ec2.create_tags(Resources=[got.instance_id, got.security_group_id], Tags=past)
    iam.tag_role(RoleName=got.role, Tags=past)
    iam.tag_instance_profile(InstanceProfileName=got.instance_profile, Tags=past)
    found = T.find(ec2, iam, expired=True)
    assert found.instances == [got.instance_id] and found.roles == [got.role]
