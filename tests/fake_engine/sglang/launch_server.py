"""A fake `python3 -m sglang.launch_server` for gpureap's tests of `run --plan`:
the command line is SGLang's (so `gpureap plan` reads it), the process loads
nothing. It records that it started (FAKE_ENGINE_STARTED: a file it appends its
PID to), prints SGLang's start-up lines with FAKE_ENGINE_TOKENS as the KV
cache it "allocated", says it is ready, and serves until SIGTERM (exit 0).
"""

import os
import signal
import sys
import time


def main():
    started = os.environ.get("FAKE_ENGINE_STARTED")
    if started:
        with open(started, "a") as marker:
            marker.write(f"{os.getpid()}\n")
    tokens = int(os.environ.get("FAKE_ENGINE_TOKENS", "100000"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    for line in [
        "[TP0] Load weight begin. avail mem=78.50 GB",
        "[TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.41 GB, mem usage=15.09 GB.",
        f"[TP0] KV Cache is allocated. #tokens: {tokens}, K size: 6.00 GB, V size: 6.00 GB",
        "[TP0] Memory pool end. avail mem=50.10 GB",
        "The server is fired up and ready to roll!",
    ]:
        print(line, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
