"""poolctl on AWS. `ops.AwsOps` (made by `ops.make_ops`, reached through
`poolctl.clouds.registry`) is the group, nodes, capacity and queue of `ops` with `quota`
(Service Quotas), `rollout` (instance refresh) and `inventory` (what status, ls and logs
read), on the clients and one-line errors of `api`. `adopt` finds what an interrupted apply
created but did not record (for `poolctl.deploy`).
"""
