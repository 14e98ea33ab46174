"""boto3 sessions and the credential check that runs before any call."""
from __future__ import annotations


class MissingCredentials(RuntimeError):
    """No AWS credentials were found; raised before any API call is made."""


_HOW = ("configure them with `aws configure` / `aws sso login`, or set AWS_PROFILE, or "
        "AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY; `python -m deploy launch --dry-run` "
        "prints the plan without credentials")


def boto3_module():
    try:
        import boto3
    except ImportError as exc:  # the deploy extra is optional
        raise ImportError("deploy needs boto3: pip install -e '.[deploy]'", name="boto3") from exc
    return boto3


def session(region: str | None = None, profile: str | None = None):
    """A boto3 session (no call is made)."""
    boto3 = boto3_module()
    return boto3.session.Session(region_name=region, profile_name=profile)


def has_credentials(sess) -> bool:
    """Whether the session can sign requests (reads config / env only; no network call)."""
    try:
        creds = sess.get_credentials()
    except Exception:  # e.g. a profile name that is not configured
        return False
    return creds is not None and bool(getattr(creds, "access_key", None))


def require_credentials(sess, verb: str) -> None:
    """MissingCredentials with instructions when the session has none (before any call)."""
    if not has_credentials(sess):
        raise MissingCredentials(f"`python -m deploy {verb}` needs AWS credentials and none were "
                                 f"found; {_HOW}")


def client(sess, service: str, region: str | None = None):
    return sess.client(service, region_name=region or sess.region_name)
