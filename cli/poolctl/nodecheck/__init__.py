"""`poolctl nodes check`: SSH into pool nodes and verify what the pool needs of each one.

Per node, in order: `ssh` (strict host-key checking, never trust on first use), `gpus` (count,
model and HBM of the catalog row), `nvlink` (every GPU pair over NVLink, no inactive link),
`no-efa` (no EFA / RDMA NIC: inference pools leave them off), `cache-mount` (the NVMe cache at
`naming.CACHE_MOUNT`), `cache-size` (room for the weights with the rule's headroom), `image`
(the serving image on the node) and `health` (the server answers 200 on its health path).

- checks: the remote commands, and small pure functions parsing and judging their output;
- ssh: the SSH layer (paramiko), which only runs commands and maps connection failures to one
  clear line, and the ways in (own keys, EC2 Instance Connect, IAP with OS Login);
- orchestration: which nodes against which pool, checked concurrently.
"""

from poolctl.nodecheck.checks import CHECK_NAMES, Check, NodeResult
from poolctl.nodecheck.orchestration import check_nodes, plan_work, progress_line
from poolctl.nodecheck.ssh import SshOptions

__all__ = ["CHECK_NAMES", "Check", "NodeResult", "SshOptions", "check_nodes", "plan_work",
           "progress_line"]
