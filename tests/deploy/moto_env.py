"""Names and helpers of the moto test account (imported by conftest.py and the tests; a module of its
own because several conftest.py files share the module name "conftest")."""
REGION = "sa-east-1"   # deploy/config.py DEFAULT_REGION (a test checks they agree)
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


def register_dlami(ec2, release: str = "2.34.0", os_name: str = "Ubuntu 24.04",
                   date: str = "20261130", words: str = "torch-neuronx 2.14.0") -> str:
    """A Neuron DLAMI image in moto's EC2 (the test account owns it), named and described
    the way the DLAMI guide says (release in the description) -> its id."""
    return ec2.register_image(
        Name=f"Deep Learning AMI Neuron {words} ({os_name}) {date}",
        Description=f"Supported EC2 instances: Trn2, Trn3. Neuron SDK {release}, PyTorch 2.14",
        Architecture="x86_64", RootDeviceName="/dev/sda1")["ImageId"]
