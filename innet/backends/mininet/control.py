"""The controller's end of a switch process's control channel: JSON lines on a Unix socket.

``install`` hands a switch its routes and jobs, ``stats`` reads its counters and CPU, ``stop_all`` ends them
(innet.node.switch serves the other end). Messages and answers are the records of innet.node.config,
through innet.node.codec.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

from innet.errors import UserError
from innet.node.codec import from_json, to_json
from innet.node.config import Install, Installed, SwitchStats
from innet.switch.runtime import SwitchConfig


class Control:
    """One switch's control channel. ``proc``, the process serving the switch, is watched while the socket
    comes up: if it dies, that is said at once, with the last line of its ``log``."""

    def __init__(self, path: str, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None,
                 log: str | None = None) -> None:
        self.path = path
        self.name = os.path.basename(path).removesuffix(".sock")
        self.log = log or path.removesuffix(".sock") + ".log"
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if proc is not None and proc.poll() is not None:
                    raise UserError(f"switch process {self.name} exited before its control socket came up: "
                                    f"{self.last_words()}") from None
                if time.monotonic() > deadline:
                    raise UserError(f"switch control socket {path} did not come up in {timeout:.0f}s") from None
                time.sleep(0.05)
        self.file = self.sock.makefile("rb")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def install(self, config: SwitchConfig) -> Installed:
        """Install ``config`` on the switch; a switch that refuses it stops the run with its reason."""
        reply = from_json(Installed, self._call("install", to_json(Install(config))))
        if reply.error:
            raise UserError(reply.error)
        return reply

    def stats(self) -> SwitchStats:
        return from_json(SwitchStats, self._call("stats"))

    def _call(self, op: str, message: object = None) -> object:
        """Send one message (a record's JSON, with its ``op``); the switch's answer, as JSON values."""
        self._send(op, message)
        return self._answer()

    def _send(self, op: str, message: object = None) -> None:
        body = {"op": op, **(message if isinstance(message, dict) else {})}
        try:
            self.sock.sendall(json.dumps(body).encode() + b"\n")
        except OSError:
            pass  # the switch is gone: its answer says so

    def _answer(self) -> object:
        try:
            line = self.file.readline()
        except OSError:
            line = b""
        if not line:
            raise UserError(f"switch process {self.name} exited unexpectedly: {self.last_words()}")
        answer: object = json.loads(line)
        return answer

    def last_words(self) -> str:
        """The last line the switch process wrote to its log (its error, when it crashed)."""
        try:
            with open(self.log, encoding="utf-8", errors="replace") as fh:
                lines = [ln.strip() for ln in fh if ln.strip()]
        except OSError:
            lines = []
        return lines[-1] if lines else "no message"


def stop_all(controls: list[Control]) -> None:
    """``stop`` every switch of ``controls``, all told before any answer is awaited: the processes serving them stop
    theirs at once (one after the other, k=8's 80 eBPF switches took 7.6 s at load 10, each detaching its ports'
    programs)."""
    for ctl in controls:
        ctl._send("stop")
    for ctl in controls:
        ctl._answer()
