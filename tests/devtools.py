"""Headless Chromium driven over the Chrome DevTools Protocol, on a pipe: the test types
into a page and reads it back as a user would see it. No extra package: with
``--remote-debugging-pipe`` Chromium reads commands (JSON, each ending in a NUL byte) on
file descriptor 3 and writes replies on 4."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time


def find_chromium() -> str:
    """The Chromium (or Chrome) executable, or an error that says how to get one."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise RuntimeError("no Chromium found: `make test` installs it (apt-get install chromium); "
                       "elsewhere, install Chromium or Chrome and put it on the PATH")


class Chromium:
    def __init__(self, width: int = 1000, height: int = 700):
        commands_read, self.commands = os.pipe()
        self.replies, replies_write = os.pipe()
        # the protocol's fds are 3 and 4 in the child: move ours above them first
        child_in, child_out = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
                               for fd in (commands_read, replies_write))
        self.process = subprocess.Popen(
            [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(child_in, 3), os.dup2(child_out, 4)))
        for fd in (commands_read, replies_write, child_in, child_out):
            os.close(fd)
        self.last_id, self.pending, self.session = 0, b"", None

    def call(self, method: str, **params):
        """Send one command (to the page once :meth:`open` attached) and wait for its reply."""
        self.last_id += 1
        message = {"id": self.last_id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.pending:
                self.pending += os.read(self.replies, 1 << 16)
            raw, self.pending = self.pending.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout} s: {expression}")
            time.sleep(0.1)

    def type(self, text: str) -> None:
        self.call("Input.insertText", text=text)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot")["data"])

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        os.close(self.commands)
        os.close(self.replies)
