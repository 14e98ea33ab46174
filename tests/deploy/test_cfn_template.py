"""The CloudFormation template of the bench host: clean under cfn-lint, and the same host
as `python -m deploy launch` (IMDSv2, no key pair, no inbound rule, TTL, least privilege)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cfnlint.api import ManualArgs, lint_file
from cfnlint.decode import decode

from deploy import config as C

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "cfn" / "trn-bench-host.yaml"


def test_template_is_clean_under_cfn_lint():
    regions = sorted({r for r, _, _ in C.OFFERING_EVIDENCE} | {"us-east-1"})
    matches = lint_file(TEMPLATE, config=ManualArgs(regions=regions))
    assert matches == [], [str(m) for m in matches]
    # and the command line users run (repo config .cfnlintrc.yaml), exit code 0 = no finding
    cli = "import sys; from cfnlint.runner import main; sys.argv[0] = 'cfn-lint'; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", cli, str(TEMPLATE)], capture_output=True,
                          cwd=TEMPLATE.parents[2])
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_cfn_lint_catches_a_broken_template(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TEMPLATE.read_text().replace("InstanceInitiatedShutdownBehavior: terminate",
                                                "InstanceInitiatedShutdownBehavior: explode"))
    assert lint_file(bad, config=ManualArgs(regions=["us-east-2"])) != []


def test_template_describes_the_same_host():
    t, errors = decode(str(TEMPLATE))
    assert not errors
    res = t["Resources"]
    host = res["Host"]["Properties"]
    assert host["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert "KeyName" not in host
    lt = res["HostLaunchTemplate"]["Properties"]["LaunchTemplateData"]["MetadataOptions"]
    assert lt["HttpTokens"] == "required"
    sg = res["HostSecurityGroup"]["Properties"]
    assert "SecurityGroupIngress" not in sg
    assert {r["FromPort"] for r in sg["SecurityGroupEgress"]} == {80, 443}
    assert not [r for r in res if res[r]["Type"] == "AWS::EC2::SecurityGroupIngress"]
    role = res["HostRole"]["Properties"]
    assert role["Path"] == C.IAM_PATH
    assert [p["Fn::Sub"] for p in role["ManagedPolicyArns"]] == [
        "arn:${AWS::Partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"]
    (pol,) = role["Policies"]
    actions = sorted(a for st in pol["PolicyDocument"]["Statement"]
                     for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"]))
    assert actions == ["s3:GetObject", "s3:ListBucket", "s3:PutObject"]
    # the AMI `python -m deploy ami` prints (the DLAMI's SSM parameter name is UNVERIFIED: no
    # default that could name a parameter that does not exist)
    assert t["Parameters"]["ImageId"]["Type"] == "AWS::EC2::Image::Id"
    assert "Default" not in t["Parameters"]["ImageId"]
    assert "python -m deploy ami" in t["Parameters"]["ImageId"]["Description"]
    assert t["Parameters"]["InstanceType"]["Default"] == C.DEFAULT_INSTANCE_TYPE
    assert t["Parameters"]["RootVolumeGb"]["Default"] == C.ROOT_VOLUME_GB
    user_data = host["UserData"]["Fn::Base64"]["Fn::Sub"]
    assert "--on-active=${TtlMinutes}m /sbin/shutdown -h now" in user_data
    for r in ("Host", "HostSecurityGroup", "HostRole"):
        keys = {tag["Key"] for tag in res[r]["Properties"]["Tags"]}
        assert {C.TAG_PROJECT, C.TAG_RUN_ID, C.TAG_TTL_EXPIRES} <= keys
