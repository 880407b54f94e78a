#!/usr/bin/env python3
"""Dry-runs a GPU validation script on gpureap's simulated driver.

    python3 tests/gpu_sim/simulate.py GPUS -- python3 scripts/gpu_validate.py target/debug/gpureap [--out DIR]

Makes a simulated driver with GPUS GPUs (141 GiB each, named "NVIDIA H200
(simulated)") in a fresh directory, and runs the command with
GPUREAP_VALIDATE_SIM set to it: the scripts then call gpureap with
--backend sim:DIR and import the stand-ins for pynvml and PyTorch in this
directory. It checks the scripts' own logic (process set-up, scoping,
per-GPU bookkeeping, cleanup) on a machine without a GPU; it says nothing
about the real driver. Exits with the command's exit code.
"""

import os
import shutil
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        raise SystemExit(__doc__)
    gpus = int(sys.argv[1])
    sim = tempfile.mkdtemp(prefix="gpureap-sim-gpus-")
    try:
        os.makedirs(os.path.join(sim, "claims"))
        for index in range(gpus):
            open(os.path.join(sim, f"nvidia{index}"), "w").close()
        open(os.path.join(sim, "nvidiactl"), "w").close()
        with open(os.path.join(sim, "gpus"), "w") as out:
            out.write("".join(f"{143771336704} NVIDIA H200 (simulated)\n" for _ in range(gpus)))
        env = dict(os.environ, GPUREAP_VALIDATE_SIM=sim)
        return subprocess.run(sys.argv[3:], env=env).returncode
    finally:
        shutil.rmtree(sim, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
