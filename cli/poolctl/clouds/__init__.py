"""What poolctl does on each cloud at runtime, one package per cloud (`aws/`, `gcp/`: api,
ops, quota, rollout, inventory), behind the cloud-neutral interface of `base.py`.

The rest of poolctl reaches a cloud through `registry.py` and `base.py` only. Importing any
module here loads no cloud SDK: the SDKs load on first use through `poolctl.adaptors`.
"""
