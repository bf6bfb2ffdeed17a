#!/usr/bin/env bash
# Set up everything on Debian 12 and run the main job: the lab report in quick mode.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing "${BUILD_PACKAGES[@]}"
configure_and_build
cd "$ROOT"
if "$BUILD/sdpa" report --help >/dev/null 2>&1; then
  "$BUILD/sdpa" report --quick --out "$ROOT/report"
  echo "== report written: $ROOT/report/index.html (and report.md)"
else
  # Until the report exists: the article's softmax example and a small attention call.
  "$BUILD/sdpa" softmax --logits 1000,10,5
  /usr/bin/python3 - "$BUILD/sdpa" <<'PY'
import os, subprocess, sys, tempfile
import numpy as np
sdpa = sys.argv[1]
with tempfile.TemporaryDirectory() as d:
    rng = np.random.default_rng(1)
    for name, shape in (("q", (2, 8, 64)), ("k", (2, 16, 64)), ("v", (2, 16, 32))):
        np.save(os.path.join(d, name + ".npy"), rng.standard_normal(shape).astype(np.float32))
    subprocess.run([sdpa, "attention", "--query", f"{d}/q.npy", "--key", f"{d}/k.npy",
                    "--value", f"{d}/v.npy", "--out", f"{d}/o.npy", "--causal", "lower-right"],
                   check=True)
    print("attention (2, 8, 64) x (2, 16, 64) -> out", np.load(f"{d}/o.npy").shape)
PY
fi
