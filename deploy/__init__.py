"""deploy/: provision a trn2 / trn3 instance, compile, check and time every kernel on it,
and bring back a measured-vs-modeled report.

    python -m deploy launch --dry-run        # the plan: every API call, type, AMI, price
    python -m deploy host-script --bucket B  # the commands SSM runs on the host (POSIX sh)
    python -m deploy run --bucket B          # the one command: launch, bench, collect, teardown
    python -m deploy.bench --compile-only --dry-run   # what the on-host step would compile

Sub-packages: ``provision`` (boto3; payload builders are pure functions),
``bench`` (runs on the instance, or any host with the Neuron SDK). boto3 is
imported lazily, so the bench and the report need only the package's core
dependencies.
"""
