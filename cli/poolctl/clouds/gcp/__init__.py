"""poolctl on GCP. `ops.GcpOps` (made by `ops.make_ops`, reached through
`poolctl.clouds.registry`) is the nodes, capacity and queue of `ops` with `quota` (Cloud
Quotas), `rollout` (the canary state machine), `inventory` (what status, ls and logs
read), `launches` (the VMs the MIG cannot create) and `capacity` (capacity check's
reservations), on `mig` (finding and reading the pool's regional MIG) and the clients, retries and
one-line errors of `api`.
"""
