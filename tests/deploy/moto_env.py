"""Names of the moto test account (imported by conftest.py and the tests; a module of its
own because several conftest.py files share the module name "conftest")."""
REGION = "us-east-2"
BUCKET = "nki-ssm-bench-results-test"
