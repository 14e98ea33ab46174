"""Pure payload builders of deploy.provision.plan (no AWS at all)."""
from __future__ import annotations

import datetime as _dt
import json

import pytest

from deploy import config as C
from deploy.provision import plan as P

NOW = _dt.datetime(2026, 11, 24, 12, 0, 0, tzinfo=_dt.timezone.utc)


def test_run_id_names_and_ttl():
    rid = P.new_run_id(NOW)
    assert rid.startswith("20261124-120000-") and len(rid) == 20 and P.check_run_id(rid) == rid
    n = P.Names(rid)
    assert n.role == n.instance_profile == n.security_group == f"nki-ssm-bench-{rid}"
    assert len(n.role) <= 64 and n.results_prefix == f"nki-ssm-bench/{rid}"
    assert P.ttl_expiry(1.5, NOW) == "2026-11-24T13:30:00Z"
    with pytest.raises(ValueError):
        P.ttl_expiry(0, NOW)


def test_results_policy_is_one_prefix():
    doc = P.results_policy("bkt", "/nki-ssm-bench/r1/")
    (objects, listing) = doc["Statement"]
    assert objects["Action"] == ["s3:GetObject", "s3:PutObject"]
    assert objects["Resource"] == "arn:aws:s3:::bkt/nki-ssm-bench/r1/*"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["nki-ssm-bench/r1/*"]}}
    assert "*" not in json.dumps([s["Action"] for s in doc["Statement"]])   # no wildcard action
    with pytest.raises(ValueError, match="bucket"):
        P.results_policy("bkt/sub", "p")
    assert P.trust_policy()["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}


def test_user_data_timers():
    ud = P.user_data("r1", 0.5, "2026-11-24T12:30:00Z")
    assert ud.startswith("#!/bin/bash\n")
    assert "systemd-run --unit=nki-ssm-bench-ttl --on-active=30m /sbin/shutdown -h now" in ud
    assert "shutdown -h +30 " in ud and "2026-11-24T12:30:00Z" in ud


def test_capacity_block_payload():
    tags = P.tags("r1", "2026-11-24T12:30:00Z")
    base = dict(image_id="ami-1", instance_type="trn2.48xlarge", subnet_id="subnet-1",
                security_group_id="sg-1", instance_profile="p", user_data_script="#!", resource_tags=tags)
    plain = P.run_instances_params(**base)
    assert "CapacityReservationSpecification" not in plain and "InstanceMarketOptions" not in plain
    cb = P.run_instances_params(**base, capacity_reservation_id="cr-0123")
    assert cb["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123"}}
    assert cb["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert {k: v for k, v in cb.items() if k not in ("CapacityReservationSpecification",
                                                     "InstanceMarketOptions")} == plain


def test_create_calls_order_and_kinds():
    s = P.LaunchSettings(run_id="r1", bucket="bkt", ttl_hours=1)
    calls = P.create_calls(s, now=NOW)
    assert [c.operation for c in calls] == [
        "head_bucket", "create_role", "attach_role_policy", "put_role_policy", "create_instance_profile",
        "add_role_to_instance_profile", "create_security_group", "run_instances"]
    assert [c.kind for c in calls] == ["read"] + ["create"] * 7
    role = calls[1].params
    assert role["Path"] == C.IAM_PATH and {t["Key"] for t in role["Tags"]} >= {C.TAG_RUN_ID, C.TAG_TTL_EXPIRES}
    assert calls[-1].params["TagSpecifications"][0]["Tags"][3] == {
        "Key": C.TAG_TTL_EXPIRES, "Value": "2026-11-24T13:00:00Z"}
    with pytest.raises(ValueError, match="sdk"):
        P.LaunchSettings(run_id="r1", sdk="nope")
