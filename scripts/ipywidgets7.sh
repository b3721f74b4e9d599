#!/usr/bin/env bash
# Run the widget tests under ipywidgets 7.7 (the version Colab ships), reusing .venv, and the
# explorer in Chromium under the classic notebook's ipywidgets 7 front end.
#
# .venv/ipywidgets7 is a second virtual environment that sees all of .venv's packages through a
# .pth file, with ipywidgets 7.7.x, widgetsnbextension 3.6.x and jupyterlab_widgets 1.1.x
# installed on top so they shadow .venv's ipywidgets 8, and the classic notebook server
# (notebook 6.5.x, which needs jupyter_client 7 and so ipykernel 6) with widgetsnbextension's
# and anywidget's nbextensions enabled in this venv's prefix. Idempotent: the second run only
# checks a stamp and runs the tests. Usage: scripts/ipywidgets7.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

MAIN=.venv
ALT=.venv/ipywidgets7  # inside .venv: git-ignored, linters skip it, make clean removes it
PINS=(ipywidgets==7.7.5 "widgetsnbextension==3.6.*" "jupyterlab_widgets==1.1.*" ipython_genutils==0.2.0
  # the classic notebook for tests/test_browser_ipywidgets7.py, and what it needs beyond .venv
  "notebook==6.5.*" "nbclassic==1.3.*" "jupyter_client==7.4.*" "ipykernel==6.29.*"
  "nest-asyncio==1.6.*" "entrypoints==0.4.*")

if [ ! -x "$MAIN/bin/python" ]; then
  echo "no $MAIN: run 'make install' first" >&2
  exit 2
fi
# anywidget's front end is copied from .venv (below): a new anywidget there rebuilds this venv
ANYWIDGET=$("$MAIN/bin/python" -c 'import importlib.metadata as m; print(m.version("anywidget"))')
STAMP="$ALT/.installed-$(printf '%s ' "$PWD" "${PINS[@]}" "anywidget==$ANYWIDGET" | cksum | cut -d' ' -f1)"

if [ ! -f "$STAMP" ]; then
  rm -rf "$ALT"
  "$MAIN/bin/python" -m venv --without-pip "$ALT"
  main_site=$("$MAIN/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  alt_site=$("$ALT/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # addsitedir (not a bare path) so .venv's own .pth files (the editable install) apply too;
  # it appends, so the packages installed in $ALT come first on sys.path.
  echo "import site; site.addsitedir('$(cd "$main_site" && pwd)')" > "$alt_site/zz_main_venv.pth"
  "$MAIN/bin/pip" --python "$ALT/bin/python" install -q --disable-pip-version-check \
    --no-deps -c constraints.txt "${PINS[@]}"
  # the notebook's front end: ipywidgets 7's (widgetsnbextension installs its files into this
  # prefix) and anywidget's, copied from .venv's prefix, which this notebook does not read (a
  # link would not do: the notebook refuses files whose real path is outside its folders)
  quiet() { local out; out=$("$@" 2>&1) || { echo "$out" >&2; return 1; }; }
  quiet "$ALT/bin/jupyter-nbextension" install --py anywidget --sys-prefix --overwrite
  for ext in widgetsnbextension anywidget; do
    quiet "$ALT/bin/jupyter-nbextension" enable --py "$ext" --sys-prefix
  done
  touch "$STAMP"
fi

# One process: prove it imports ipywidgets 7.7, then run the widget tests in it. One torch
# thread, as in `make test`: the browser test runs a kernel beside pytest.
HF_HUB_OFFLINE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" exec "$ALT/bin/python" - "$@" <<'EOF'
import sys

import ipywidgets
import pytest

assert ipywidgets.__version__.startswith("7.7."), ipywidgets.__version__
print(f"ipywidgets {ipywidgets.__version__} from {ipywidgets.__file__}", flush=True)
tests = [
    "tests/test_widgets.py",
    "tests/test_evaluate_widgets.py",
    "tests/test_explain_widgets.py",
    "tests/test_browser_ipywidgets7.py",  # the classic notebook in Chromium
]
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *tests, *sys.argv[1:]]))
EOF
