# Sourced from the repository root by the benchmarks/cuda_*.sh scripts: what attnlab needs on a GPU machine where it
# is not installed. Pure-Python dependencies missing there travel as wheels in .whl/ and are installed once into
# /tmp/site (WHEELS_READY=1 tells a script started from another that they are); the package is read from src/;
# `stamp NAME` prints the seconds since the sourcing script started.
if [ -z "${WHEELS_READY:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site
fi
export WHEELS_READY=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # the package lives in src/ (no install on the device)
export PYTHONUNBUFFERED=1 ATTNLAB_CACHE=/tmp/attnlab-cache MPLBACKEND=Agg
t0=$(date +%s); stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
