"""CDKTF stacks: the only package that imports cdktf (the generator is replaceable)."""

import os

# jsii starts its Node kernel on the first cdktf import and prints a banner when that Node is
# end-of-life (20). The set-up installs Node 22 from npm (JSII_NODE); where the system Node
# is all there is, keep synth output clean.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
