"""Names of the moto test account (imported by conftest.py and the tests; a module of its
own because several conftest.py files share the module name "conftest")."""
REGION = "ap-southeast-4"   # deploy/config.py DEFAULT_REGION (a test checks they agree)
BUCKET = "nki-ssm-bench-results-test"
