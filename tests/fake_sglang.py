#!/usr/bin/env python3
"""A fake SGLang server for gpureap's tests: behaves like SGLang, holds no model.

    fake_sglang.py --port P --tp N --sim DIR [--fault F] [--fault-once MARKER]
                   [--line-delay S] [--cuda --gib G [--devices LIST]]

A launcher starts a detokenizer and N workers titled `sglang::scheduler_TP{r}`
(titles set with `exec -a`, as SGLang's setproctitle does). Worker r holds GPU r:
on the simulated driver it opens DIR/nvidia{r} and claims 20 GiB; with --cuda it
allocates G GiB with PyTorch on CUDA device LIST[r % len(LIST)] (--devices 0,1;
default every device), selected with torch.cuda.set_device before any other
CUDA call so that it makes no context on another GPU. Workers print rank-prefixed startup lines in
SGLang's order; once every rank is up, the launcher prints uvicorn's lines and
opens the HTTP port, where /health answers 200.

Faults (--fault), each applied only on the first start when --fault-once names
a marker file that does not exist yet:
  stall        after "Load weight end", no more output, low CPU
  spin         after "Load weight end", busy-spin with no output
  rank-dies    rank 1 SIGKILLs itself after "Load weight begin"; the rest block
  ignore-term  rank 0 ignores SIGTERM; the launcher crashes after ready
  setsid       rank 0 leaves a double-forked setsid grandchild holding GPU N
               (one past the workers); the launcher crashes after ready
  health-503   /health answers 503 after ready
  exit-0       the launcher exits 0 after ready, as vLLM's API server does when
               its engine core dies (vllm#48966), leaving its workers running
"After ready" is once /health has answered 200: the supervisor has seen the
server ready, however long that took it.

SIGTERM to the launcher shuts the server down cleanly: workers get SIGTERM, the
launcher exits 0.
"""

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time

GIB = 1 << 30


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("role", nargs="?", default="launcher")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--sim", default="")
    parser.add_argument("--fault", default="none")
    parser.add_argument("--fault-once", default="")
    parser.add_argument("--line-delay", type=float, default=0.01)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--devices", default="")
    parser.add_argument("--ready-dir", default="")
    return parser.parse_args()


def say(text):
    print(text, flush=True)


def hold_gpu(args, index):
    """Holds GPU `index` the way the chosen driver sees it."""
    if args.cuda:
        import torch

        if args.devices:
            devices = [int(device) for device in args.devices.split(",")]
        else:
            devices = list(range(torch.cuda.device_count()))  # counts devices, makes no context
        device = devices[index % len(devices)]
        torch.cuda.set_device(device)  # first: no context on GPU 0 for a worker of GPU 1
        block = torch.empty(int(args.gib * GIB), dtype=torch.uint8, device=f"cuda:{device}")
        block.fill_(1)
        torch.cuda.synchronize(device)
        return block
    node = open(os.path.join(args.sim, f"nvidia{index}"), "rb")
    with open(os.path.join(args.sim, "claims", f"{os.getpid()}.{index}"), "w") as claim:
        claim.write(str(20 * GIB))
    return node


def block_forever():
    while True:
        time.sleep(3600)


def worker(args):
    rank = args.rank
    fault = args.fault
    if fault == "ignore-term" and rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    held = hold_gpu(args, rank)
    lines = [
        f"[TP{rank}] Init torch distributed begin.",
        f"[TP{rank}] Init torch distributed ends. mem usage=0.00 GB",
        f"[TP{rank}] Load weight begin. avail mem=139.21 GB",
        f"[TP{rank}] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=124.12 GB, mem usage=15.09 GB.",
        f"[TP{rank}] KV Cache is allocated. #tokens: 412345, K size: 24.50 GB, V size: 24.50 GB",
        f"[TP{rank}] Memory pool end. avail mem=12.30 GB",
        f"[TP{rank}] Capture cuda graph begin. This can take up to several minutes. avail mem=12.30 GB",
        f"[TP{rank}] Capture cuda graph end. Time elapsed: 0.40 s. mem usage=0.61 GB. avail mem=11.69 GB.",
        f"[TP{rank}] max_total_num_tokens=412345, chunked_prefill_size=8192, max_prefill_tokens=16384, context_len=131072",
    ]
    for line in lines:
        time.sleep(args.line_delay)
        say(line)
        if "Load weight begin" in line and fault == "rank-dies":
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.2)
            block_forever()  # waiting in NCCL for a rank that is gone
        if "Load weight end" in line and fault == "stall":
            block_forever()
        if "Load weight end" in line and fault == "spin":
            while True:
                pass
    if fault == "setsid" and rank == 0:
        escapee = (
            f"exec -a sglang::escapee python3 {sys.argv[0]} escapee --sim {args.sim} "
            f"--rank {args.tp} {'--cuda --gib ' + str(args.gib) if args.cuda else ''}"
            f"{' --devices ' + args.devices if args.cuda and args.devices else ''}"
        )
        markers = args.sim or "/tmp"
        before = set(name for name in os.listdir(markers) if name.startswith("escapee."))
        subprocess.run(["bash", "-c", f"( ( exec setsid bash -c '{escapee}' ) & )"], check=True)
        # Ready only once it holds its GPU: the crash after ready leaves it behind.
        while not any(
            name.startswith("escapee.") and name not in before for name in os.listdir(markers)
        ):
            time.sleep(0.02)
    open(os.path.join(args.ready_dir, f"rank{rank}"), "w").close()
    block_forever()
    return held  # the GPU is held for as long as this frame lives


def escapee(args):
    held = hold_gpu(args, args.rank)
    open(os.path.join(args.sim or "/tmp", f"escapee.{os.getpid()}"), "w").close()
    block_forever()
    return held


def spawn(title, argv):
    """Starts a child process titled `title`, sharing our stdout and stderr."""
    python_path = os.pathsep.join(path for path in sys.path if path)
    command = "exec -a " + repr(title) + " " + " ".join(argv)
    return subprocess.Popen(["bash", "-c", command], env=dict(os.environ, PYTHONPATH=python_path))


def launcher(args):
    fault = args.fault
    if args.fault_once:
        if os.path.exists(args.fault_once):
            fault = "none"
        else:
            open(args.fault_once, "w").close()
    ready_dir = os.path.join(args.sim or "/tmp", f"ready.{os.getpid()}")
    os.makedirs(ready_dir, exist_ok=True)
    say(
        f"[2026-11-30 09:00:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', "
        f"tp_size={args.tp}, port={args.port}, host='127.0.0.1', mem_fraction_static=0.88)"
    )
    children = [spawn("sglang::detokenizer", ["sleep", "100000"])]
    common = [
        "python3", sys.argv[0], "worker", "--sim", args.sim, "--tp", str(args.tp), "--fault", fault,
        "--line-delay", str(args.line_delay), "--ready-dir", ready_dir, "--gib", str(args.gib),
    ] + (["--cuda"] if args.cuda else []) + (["--devices", args.devices] if args.devices else [])
    for rank in range(args.tp):
        children.append(spawn(f"sglang::scheduler_TP{rank}", common + ["--rank", str(rank)]))

    def shutdown(signum, frame):
        say("Received sigterm, shutting down.")
        for child in children:
            try:
                os.kill(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, shutdown)
    while not all(os.path.exists(os.path.join(ready_dir, f"rank{rank}")) for rank in range(args.tp)):
        time.sleep(0.02)

    healthy = {"ok": True}
    seen_ready = threading.Event()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = 200 if self.path == "/health" and healthy["ok"] else 503 if self.path == "/health" else 404
            self.send_response(code)
            self.end_headers()
            if code == 200:
                seen_ready.set()

        def log_message(self, *_):
            pass

    say(f"INFO:     Started server process [{os.getpid()}]")
    say("INFO:     Waiting for application startup.")
    say("INFO:     Application startup complete.")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    say(f"INFO:     Uvicorn running on http://127.0.0.1:{args.port} (Press CTRL+C to quit)")
    say("The server is fired up and ready to roll!")
    if fault in ("ignore-term", "setsid"):
        seen_ready.wait()
        say("Traceback (most recent call last):")
        say("RuntimeError: CUDA error: an illegal memory access was encountered")
        sys.stderr.flush()
        os._exit(1)
    if fault == "exit-0":
        seen_ready.wait()
        say("ERROR [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.")
        say("INFO:     Shutting down")
        sys.stdout.flush()
        os._exit(0)
    if fault == "health-503":
        seen_ready.wait()
        healthy["ok"] = False
    block_forever()


def main():
    args = parse()
    {"launcher": launcher, "worker": worker, "escapee": escapee}[args.role](args)


if __name__ == "__main__":
    main()
