"""Run a command in a network namespace of its own whose only way out is a relay to named ports.

Some upstream managers bind their metrics and health listeners on every interface (Karpenter's
operator listens on ``:PORT``), and tests may serve on loopback only. This runs such a process in
a new network namespace (only its own ``lo``), where it may bind what it likes, and relays the
host's loopback TCP ports it must reach (the API server) from the same address inside the
namespace: a connection to ``127.0.0.1:PORT`` in there reaches ``127.0.0.1:PORT`` on the host,
TLS untouched, so kubeconfigs work as they are.

How: this process (single-threaded at that moment) unshares its network namespace, brings ``lo``
up, opens the listeners there and starts the command (which inherits the namespace), then returns
to the host's namespace; sockets keep the namespace they were made in, so it accepts inside and
connects outside. Needs root (CAP_SYS_ADMIN). SIGTERM/SIGINT are passed to the command; this
exits with its status.

    python -m tests.support.netns_relay --forward 127.0.0.1:6443 -- COMMAND [ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence

CLONE_NEWNET = 0x40000000
_BUFFER = 65536


def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)} (root is needed)")


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if host != "127.0.0.1" or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected 127.0.0.1:PORT")
    return host, int(port)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(_BUFFER):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (sink, source):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    """Accept inside the namespace; connect to the same address on the host (this thread's
    sockets are made after the return to the host's namespace)."""
    while True:
        try:
            inner, _ = listener.accept()
        except OSError:
            return
        try:
            outer = socket.create_connection(target, timeout=10)
            outer.settimeout(None)
        except OSError:
            inner.close()
            continue
        for a, b in ((inner, outer), (outer, inner)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def start_in_namespace(
    command: Sequence[str], forwards: Sequence[tuple[str, int]]
) -> tuple[subprocess.Popen[bytes], list[socket.socket]]:
    """Start ``command`` in a new network namespace with a listener per forwarded address there;
    returns with this process back in its own namespace."""
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        _libc_call("unshare", CLONE_NEWNET)
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        listeners = []
        for address in forwards:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(64)
            listeners.append(listener)
        child = subprocess.Popen(list(command))
    finally:
        _libc_call("setns", host_ns, CLONE_NEWNET)
        os.close(host_ns)
    return child, listeners


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--forward", type=_address, action="append", default=[], metavar="127.0.0.1:PORT")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is needed after --")
    child, listeners = start_in_namespace(command, args.forward)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _frame: child.send_signal(s))
    for listener, target in zip(listeners, args.forward, strict=True):
        threading.Thread(target=_serve, args=(listener, target), daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
