#!/usr/bin/env python3
"""A kubelet pod-resources server for the tests (tests/containers_sources.rs).

Compiles the vendored proto (proto/k8s.io/kubelet/pkg/apis/podresources/v1/
api.proto) with grpcio-tools at start, independently of gpureap's generated
code, and serves List on a unix socket from a JSON file of pods:

    [{"namespace": "ns", "name": "pod", "containers":
        [{"name": "c", "devices": [{"resource_name": "nvidia.com/gpu",
                                    "device_ids": ["GPU-..."]}]}]}]

Modes: `serve` (a real gRPC server), `hang` (accepts and never answers),
`garbage` (accepts, writes bytes that are not HTTP/2, keeps the connection).
Prints "ready" on stdout once the socket listens; runs until SIGTERM. The
raw modes record each connection they accept in SOCKET.accepted.

usage: kubelet_pod_resources.py MODE SOCKET [PODS.json]
"""

import json
import os
import signal
import socket
import sys
import tempfile
import threading

PROTO_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "proto")
PROTO = "k8s.io/kubelet/pkg/apis/podresources/v1/api.proto"


def compiled_modules():
    """api_pb2 and api_pb2_grpc, generated from the proto into a temporary folder."""
    from grpc_tools import protoc
    import importlib.resources

    import importlib

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    module = PROTO.removesuffix(".proto").replace("/", ".")
    # Imported, the modules live in memory: the folder goes before the server
    # starts, so a server killed with SIGKILL leaves nothing in the temporary
    # directory.
    with tempfile.TemporaryDirectory(prefix="podresources-") as out:
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"-I{include}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                PROTO,
            ]
        )
        if code != 0:
            sys.exit(f"protoc failed ({code})")
        sys.path.insert(0, out)
        try:
            return importlib.import_module(module + "_pb2"), importlib.import_module(
                module + "_pb2_grpc"
            )
        finally:
            sys.path.remove(out)


def serve(path, pods_file):
    import grpc
    from concurrent import futures

    pb2, pb2_grpc = compiled_modules()

    class Lister(pb2_grpc.PodResourcesListerServicer):
        def List(self, request, context):
            with open(pods_file) as f:
                pods = json.load(f)
            response = pb2.ListPodResourcesResponse()
            for pod in pods:
                item = response.pod_resources.add(name=pod["name"], namespace=pod["namespace"])
                for container in pod.get("containers", []):
                    added = item.containers.add(name=container["name"])
                    for devices in container.get("devices", []):
                        added.devices.add(
                            resource_name=devices["resource_name"],
                            device_ids=devices["device_ids"],
                        )
            return response

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb2_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port("unix:" + path)
    server.start()
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(0)


def raw(path, garbage):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print("ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    held = []
    while True:
        connection, _ = listener.accept()
        held.append(connection)
        # The test asks whether anyone connected (SOCKET.accepted).
        with open(path + ".accepted", "a") as record:
            record.write("accepted\n")
        if garbage:
            connection.sendall(b"\x00\xffthis is not HTTP/2\r\n\x1b[31m" * 64)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "serve":
        serve(path, sys.argv[3])
    elif mode in ("hang", "garbage"):
        raw(path, mode == "garbage")
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
