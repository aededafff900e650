#!/usr/bin/env bash
# The row kernel's column sums on the lent H200, in one call (carry .whl):
#   bash benchmarks/row_columns_device.sh
# benchmarks/row_columns.py (derived RMSNorm and LayerNorm backward, f32 and bf16, rows of
# 1 Ki, 4 Ki and 16 Ki at 2^26: the sums apart, in the row kernel each way, the model's
# choice), then ptxas's registers and spills of every row kernel variant it compiled.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' .whl/*.whl
timeout ${ROW_COLUMNS_SECONDS:-400} python3 benchmarks/row_columns.py "$@" 2>&1 | tee "$out/row_columns.md"
