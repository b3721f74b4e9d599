#!/usr/bin/env bash
# Run the widget tests under ipywidgets 7.7 (the version Colab ships), reusing .venv.
#
# .venv/ipywidgets7 is a second virtual environment that sees all of .venv's packages through a
# .pth file, with ipywidgets 7.7.x, widgetsnbextension 3.6.x and jupyterlab_widgets 1.1.x
# installed on top so they shadow .venv's ipywidgets 8. Idempotent: the second run only
# checks a stamp and runs the tests. Usage: scripts/ipywidgets7.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

MAIN=.venv
ALT=.venv/ipywidgets7  # inside .venv: git-ignored, linters skip it, make clean removes it
PINS=(ipywidgets==7.7.5 "widgetsnbextension==3.6.*" "jupyterlab_widgets==1.1.*" ipython_genutils==0.2.0)
STAMP="$ALT/.installed-$(printf '%s ' "$PWD" "${PINS[@]}" | cksum | cut -d' ' -f1)"

if [ ! -x "$MAIN/bin/python" ]; then
  echo "no $MAIN: run 'make install' first" >&2
  exit 2
fi

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
  touch "$STAMP"
fi

# One process: prove it imports ipywidgets 7.7, then run the widget tests in it.
HF_HUB_OFFLINE=1 exec "$ALT/bin/python" - "$@" <<'EOF'
import sys

import ipywidgets
import pytest

assert ipywidgets.__version__.startswith("7.7."), ipywidgets.__version__
print(f"ipywidgets {ipywidgets.__version__} from {ipywidgets.__file__}", flush=True)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_widgets.py", "tests/test_evaluate_widgets.py", *sys.argv[1:]]))
EOF
