"""Names and helpers of the moto test account (imported by conftest.py and the tests; a module of its
own because several conftest.py files share the module name "conftest")."""
REGION = "ap-southeast-4"   # deploy/config.py DEFAULT_REGION (a test checks they agree)
BUCKET = "nki-ssm-bench-results-test"


def seed_reserved_parameter(name: str, value: str, region: str = REGION) -> None:
    """Put a parameter under /aws/... into moto's SSM backend. PutParameter on a reserved
    name is refused (as by AWS), so the backend is written directly."""
    import datetime as _dt

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import Parameter, ssm_backends

    backend = ssm_backends[DEFAULT_ACCOUNT_ID][region]
    backend._parameters[name].append(Parameter(
        account_id=DEFAULT_ACCOUNT_ID, name=name, value=value, parameter_type="String",
        description=None, allowed_pattern=None, keyid=None,
        last_modified_date=_dt.datetime.now(_dt.timezone.utc), version=1, data_type="aws:ec2:image"))
