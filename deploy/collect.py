"""Results from S3 back to the local reports/ folder."""
from __future__ import annotations

from pathlib import Path


def collect(s3, bucket: str, prefix: str, out_dir, log=print, dry_run: bool = False) -> list[Path]:
    """Download every object under ``s3://bucket/prefix/results/`` into ``out_dir``
    (same relative paths). -> the local files (``dry_run``: only list them)."""
    out = Path(out_dir)
    root = f"{prefix.strip('/')}/results/"
    files = []
    token = None
    while True:
        kw = {"Bucket": bucket, "Prefix": root}
        if token:
            kw["ContinuationToken"] = token
        resp = s3.list_objects_v2(**kw)
        for obj in resp.get("Contents", []):
            rel = obj["Key"][len(root):]
            if not rel or rel.endswith("/") or ".." in Path(rel).parts:
                continue
            dest = out / rel
            files.append(dest)
            if dry_run:
                log(f"  s3://{bucket}/{obj['Key']} -> {dest}")
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(dest))
        if not resp.get("IsTruncated"):
            break
        token = resp.get("NextContinuationToken")
    log(f"dry run: {len(files)} files would go to {out}; nothing was downloaded" if dry_run
        else f"collected {len(files)} files into {out}")
    return files
