#!/usr/bin/env bash
# Write a Terraform CLI config that installs providers from the machine's filesystem mirror (the registry is
# unreachable here) and print the `export TF_CLI_CONFIG_FILE=...` line to eval.
#   eval "$(bash infra/terraform/cli-config.sh)"
# The mirror root is the folder above registry.terraform.io; TF_PLUGIN_MIRROR overrides the search.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mirror="${TF_PLUGIN_MIRROR:-}"
if [ -z "$mirror" ]; then
    # Skip working directories' .terraform/ folders (they hold copies of providers, not a mirror).
    found="$(find / -maxdepth 7 \( -name .terraform -o -path /proc \) -prune -o \
        -path '*/registry.terraform.io/hashicorp/aws' -type d -print -quit 2>/dev/null || true)"
    if [ -z "$found" ]; then
        echo "no Terraform provider mirror (registry.terraform.io/hashicorp/aws) found on this machine" >&2
        exit 1
    fi
    mirror="$(dirname "$(dirname "$(dirname "$found")")")"
fi
config="$root/.tools/terraform/cli.tfrc"
mkdir -p "$(dirname "$config")"
cat > "$config" <<CONFIG
provider_installation {
  filesystem_mirror {
    path    = "$mirror"
    include = ["registry.terraform.io/*/*"]
  }
  direct {
    exclude = ["registry.terraform.io/*/*"]
  }
}
CONFIG
echo "export TF_CLI_CONFIG_FILE=$config"
