"""The stacks' old import path, kept only so that `python -m poolctl.stacks.app` (the `app` of a
cdktf.json that `poolctl init` wrote before the stacks became `poolctl_stacks`) still runs."""
