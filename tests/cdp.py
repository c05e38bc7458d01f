"""One headless Chromium, many pages: a minimal Chrome DevTools Protocol client over the standard library.

Chromium is started once with --remote-debugging-port=0; each page is a target in that one browser process, opened,
read (the DOM as Chromium rendered it) and screenshotted over the browser's WebSocket. Only what the tests need:
text frames (fragmented or not), ping, close; client frames masked as RFC 6455 requires.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-port=0",
    "--window-size=1500,1000",
]


class _WebSocket:
    def __init__(self, url: str, timeout: float = 30) -> None:
        parsed = urlparse(url)
        self.sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("DevTools closed the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(head.decode(errors="replace"))

    def _exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            out += chunk
        return bytes(out)

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytearray([0x81])
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(bytes(header) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> str:
        message = bytearray()
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            opcode = b0 & 0x0F
            if opcode == 8:
                raise ConnectionError("DevTools closed the WebSocket")
            if opcode == 9:  # ping: answer with a masked pong
                mask = os.urandom(4)
                pong = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                self.sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask + pong)
                continue
            if opcode in (0, 1):
                message += payload
                if b0 & 0x80:
                    return message.decode()


class Browser:
    """One Chromium process; `page(url)` opens a tab in it and gives back (DOM, PNG bytes)."""

    def __init__(self, chromium: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="gpuwatch-chromium-", ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        deadline, url = time.monotonic() + 60, None
        while url is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            match = re.search(r"DevTools listening on (ws://\S+)", line)
            if match:
                url = match.group(1)
        if url is None:
            raise RuntimeError("chromium never said where DevTools listens")
        self.ws = _WebSocket(url)
        self._ids = itertools.count(1)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})  # type: ignore[no-any-return]

    def page(self, url: str, width: int | None = None, media: str | None = None) -> tuple[str, bytes]:
        """The page's DOM and a screenshot; `width` sets the window's CSS width, `media` emulates a CSS media type
        ("print") before the page loads."""
        emulated = width is not None or media is not None
        target = self.call("Target.createTarget", {"url": "about:blank" if emulated else url})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            if width is not None:
                metrics = {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}
                self.call("Emulation.setDeviceMetricsOverride", metrics, session)
            if media is not None:
                self.call("Emulation.setEmulatedMedia", {"media": media}, session)
            if emulated:
                self.call("Page.navigate", {"url": url}, session)
            deadline = time.monotonic() + 30
            dom = None
            while dom is None:
                assert time.monotonic() < deadline, f"{url} never finished loading"
                value = self.call(
                    "Runtime.evaluate",
                    {
                        "expression": "document.readyState === 'complete' && location.href === "
                        f"{json.dumps(url)} ? document.documentElement.outerHTML : null",
                        "returnByValue": True,
                    },
                    session,
                )["result"].get("value")
                if isinstance(value, str):
                    dom = value
                else:
                    time.sleep(0.1)
            shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session)
            return str(dom), base64.b64decode(shot["data"])
        finally:
            self.call("Target.closeTarget", {"targetId": target})

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._profile.cleanup()


def save(path: Path, png: bytes) -> Path:
    path.write_bytes(png)
    return path
