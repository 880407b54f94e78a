#!/usr/bin/env python3
"""What each NVML call that `status` makes costs on this GPU host, in the order `status` makes
them (crates/core/src/driver/nvml.rs: `NvmlDriver::open`, `gpu`, `health`, `activity`; crates/core/src/snapshot/mps.rs), each in a
fresh process so that first calls pay what they pay in `status`. Median of N runs (default 11).
With --fields-first, the health figures are first asked in one nvmlDeviceGetFieldValues call
(ECC, retired pages, row remapping, recovery action), then one by one as before, and the values of
both are printed (of the last run) to compare.

    python3 bench/nvml_calls.py [N] [--fields-first]
    python3 bench/nvml_calls.py [N] --parallel

With --parallel: whether NVML answers calls of several threads at once. The health and activity
calls `status` makes off the snapshot's path (ECC, retired pages, utilization, power, process
utilization) on GPU 0, one after another on one thread against each group on a thread of its
own, N times each, alternately: the median wall time of both.

Needs pynvml (nvidia-ml-py). With a process holding memory on GPU 0 the lists are not empty:
start one first (bench/bench.py's worker, or any CUDA program).
"""
import json, statistics, subprocess, sys, time

ONE_RUN = r'''
import json, time, pynvml as n
t = {}
def timed(name, call, *args):
    s = time.perf_counter()
    try:
        r = call(*args)
    except n.NVMLError as e:
        r = e
    t[name] = t.get(name, 0) + (time.perf_counter() - s) * 1e3
    return r
timed("nvmlInit", n.nvmlInit)
count = timed("DeviceGetCount", n.nvmlDeviceGetCount)
for i in range(count):
    h = timed("GetHandleByIndex (open)", n.nvmlDeviceGetHandleByIndex, i)
    timed("GetPciInfo (open)", n.nvmlDeviceGetPciInfo, h)
    timed("GetMinorNumber (open)", n.nvmlDeviceGetMinorNumber, h)
    timed("GetName (open)", n.nvmlDeviceGetName, h)
    timed("GetUUID (open)", n.nvmlDeviceGetUUID, h)
timed("SystemGetDriverVersion (open)", n.nvmlSystemGetDriverVersion)
for i in range(count):
    h = timed("GetHandleByIndex (gpu)", n.nvmlDeviceGetHandleByIndex, i)
    timed("GetMemoryInfo v2 (gpu)", n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2)
    timed("GetComputeRunningProcesses (gpu)", n.nvmlDeviceGetComputeRunningProcesses, h)
    timed("GetMPSComputeRunningProcesses (gpu)", n.nvmlDeviceGetMPSComputeRunningProcesses, h)
    timed("GetGraphicsRunningProcesses (gpu)", n.nvmlDeviceGetGraphicsRunningProcesses, h)
    timed("GetMigMode (gpu)", n.nvmlDeviceGetMigMode, h)
for i in range(count):
    h = timed("GetHandleByIndex (mps)", n.nvmlDeviceGetHandleByIndex, i)
    timed("GetMPSComputeRunningProcesses again (mps)", n.nvmlDeviceGetMPSComputeRunningProcesses, h)
values = {}
if FIELDS_FIRST:
    for i in range(count):
        h = n.nvmlDeviceGetHandleByIndex(i)
        got = timed("GetFieldValues x6: ECC DBE vol/agg, retired pending, remap pending/failure, recovery (fields)",
                    n.nvmlDeviceGetFieldValues, h,
                    [n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, n.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, n.NVML_FI_DEV_RETIRED_PENDING,
                     n.NVML_FI_DEV_REMAPPED_PENDING, n.NVML_FI_DEV_REMAPPED_FAILURE,
                     getattr(n, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)])
        if not isinstance(got, Exception):
            values[f"fields gpu{i}"] = [(f.nvmlReturn, f.value.ullVal) for f in got]
for i in range(count):
    h = timed("GetHandleByIndex (health)", n.nvmlDeviceGetHandleByIndex, i)
    values[f"calls gpu{i}"] = [
        str(timed("GetTotalEccErrors volatile (health)", n.nvmlDeviceGetTotalEccErrors, h,
                  n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)),
        str(timed("GetTotalEccErrors aggregate (health)", n.nvmlDeviceGetTotalEccErrors, h,
                  n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC))]
    timed("GetFieldValues x3 (health)", n.nvmlDeviceGetFieldValues, h,
          [n.NVML_FI_DEV_REMAPPED_PENDING, n.NVML_FI_DEV_REMAPPED_FAILURE,
           getattr(n, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)])
    values[f"calls gpu{i}"].append(str(timed("GetRetiredPagesPendingStatus (health)",
                                             n.nvmlDeviceGetRetiredPagesPendingStatus, h)))
for i in range(count):
    h = timed("GetHandleByIndex (activity)", n.nvmlDeviceGetHandleByIndex, i)
    timed("GetUtilizationRates (activity)", n.nvmlDeviceGetUtilizationRates, h)
    timed("GetTemperature (activity)", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
    timed("GetPowerUsage (activity)", n.nvmlDeviceGetPowerUsage, h)
    timed("GetPowerManagementLimit (activity)", n.nvmlDeviceGetPowerManagementLimit, h)
    timed("GetProcessUtilization (activity)", n.nvmlDeviceGetProcessUtilization, h,
          int((time.time() - 1) * 1e6))
def kmsg():
    import os
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    records = 0
    while True:
        try:
            if not os.read(fd, 16384):
                break
            records += 1
        except BlockingIOError:
            break
        except BrokenPipeError:
            continue
    os.close(fd)
    return records
t["kmsg records"] = 0
try:
    s = time.perf_counter(); t["kmsg records"] = kmsg(); t["read /dev/kmsg (evidence)"] = (time.perf_counter() - s) * 1e3
except OSError:
    pass
s = time.perf_counter(); n.nvmlShutdown(); t["nvmlShutdown"] = (time.perf_counter() - s) * 1e3
print(json.dumps(t))
print(json.dumps(values))
'''

PARALLEL = r'''
import statistics, sys, threading, time, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
def tried(call, *args):
    try:
        call(*args)
    except n.NVMLError:  # Not Supported on some GPUs (retired pages on an H100)
        pass
def health():
    tried(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
    tried(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
def utilization():
    n.nvmlDeviceGetUtilizationRates(h)
    n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
def power():
    n.nvmlDeviceGetPowerUsage(h)
    n.nvmlDeviceGetPowerManagementLimit(h)
def processes():
    try:
        n.nvmlDeviceGetProcessUtilization(h, int((time.time() - 1) * 1e6))
    except n.NVMLError:
        pass
groups = [health, utilization, power, processes]
def one_thread():
    for group in groups:
        group()
def threads():
    running = [threading.Thread(target=group) for group in groups]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
times = {"one thread": [], "a thread per group": []}
for _ in range(int(sys.argv[1])):
    for name, run in (("one thread", one_thread), ("a thread per group", threads)):
        started = time.perf_counter()
        run()
        times[name].append((time.perf_counter() - started) * 1e3)
for name, measured in times.items():
    print(f"| {name} | {statistics.median(measured):.3f} ms | {min(measured):.3f} | {max(measured):.3f} |")
'''

if "--parallel" in sys.argv[1:]:
    runs = [a for a in sys.argv[1:] if a != "--parallel"]
    print("| health and activity calls, GPU 0 | median | min | max |\n|---|---|---|---|")
    subprocess.run([sys.executable, "-c", PARALLEL, runs[0] if runs else "11"], check=True)
    sys.exit(0)

args = [a for a in sys.argv[1:] if a != "--fields-first"]
fields_first = "--fields-first" in sys.argv[1:]
runs = int(args[0]) if args else 11
outputs = [subprocess.run([sys.executable, "-c", f"FIELDS_FIRST = {fields_first}\n" + ONE_RUN], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.splitlines() for _ in range(runs)]
rows = [json.loads(out[0]) for out in outputs]
print("values (last run):", outputs[-1][1])
print("| call | median ms | min | max |")
print("|---|---|---|---|")
for name in rows[0]:
    values = sorted(row.get(name, 0) for row in rows)
    print(f"| {name} | {statistics.median(values):.3f} | {values[0]:.3f} | {values[-1]:.3f} |")
