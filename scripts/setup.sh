#!/usr/bin/env bash
# Set up acetools on a fresh machine: torch (pinned, from the local disk where it lies there),
# the package with its dev and oracle extras, and the offline data the mini-world uses.
# Installs into the active Python (a venv or conda env if one is active). Idempotent.
#   bash scripts/setup.sh            # everything
#   ACETOOLS_NO_ORACLE=1 bash scripts/setup.sh   # skip fusion-bench/peft/mergekit (~1.8 GB)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP="$PY -m pip install --disable-pip-version-check --progress-bar off"

echo "==> torch, torchvision, open_clip (pinned)"
$PIP torch==2.14.1 torchvision==0.29.1 open_clip_torch==3.3.0

echo "==> acetools with its extras"
if [ "${ACETOOLS_NO_ORACLE:-0}" = "1" ]; then
  $PIP -e ".[dev]"
else
  $PIP -e ".[dev,oracle]"
  # mergekit 0.1.5 pins old dependencies; its merge functions work without them.
  $PIP --no-deps mergekit==0.1.5
fi

echo "==> offline data"
# Animal-MNIST: only its data files are read (its loader imports tensorflow), hence --no-deps.
$PIP --no-deps animal-mnist==0.4
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
  else
    echo "NOTE: Fashion-MNIST is missing. Install it with 'sudo apt-get install dataset-fashion-mnist'" >&2
    echo "      or put the four IDX files in \$ACETOOLS_DATA/fashion-mnist/." >&2
  fi
fi
$PY -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
echo "==> acetools is set up"
