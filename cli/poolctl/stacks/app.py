"""`python -m poolctl.stacks.app`: the old name of `python -m poolctl_stacks.app`. It says so on
stderr (cdktf shows it) and synthesizes as the new one does."""

import sys

if __name__ == "__main__":
    print("poolctl: cdktf.json: app `python -m poolctl.stacks.app` is the old name; change it to "
          "`python -m poolctl_stacks.app`", file=sys.stderr)
    from poolctl_stacks.app import main

    main()
