"""A real headless Chromium for the tests, driven over the Chrome DevTools Protocol (CDP).

Chromium (Debian's `chromium` package, /usr/bin/chromium; `$CHROMIUM` names
another binary) is started with `--remote-debugging-port=0`: it picks a free
port and writes it to `DevToolsActivePort` in its profile directory. The test
then talks to one page over a WebSocket (the `websockets` package, already a
dependency of the quick start's environment): navigate, wait for the load
event, evaluate JavaScript, take a screenshot, and collect what the page
logged (console errors, uncaught exceptions, failed loads).

Chromium runs in a process group of its own, killed as a group when the
browser is closed, so no renderer or zygote outlives a test.
"""

import base64
import json
import os
import signal
import subprocess
import time
import urllib.request

from websockets.sync.client import connect

DEFAULT_BINARY = "/usr/bin/chromium"
INSTALL_HINT = (
    "run `apt-get update && apt-get install -y --no-install-recommends chromium` as root "
    "(scripts/test.sh does it when run as root), or set CHROMIUM=/path/to/chromium"
)
_START_TIMEOUT_S = 30


class ChromiumMissing(RuntimeError):
    """No Chromium binary where the tests look for one."""


def chromium_binary() -> str:
    """The Chromium to run; ChromiumMissing (saying how to install it) if there is none."""
    binary = os.environ.get("CHROMIUM", DEFAULT_BINARY)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise ChromiumMissing(f"Chromium is not installed ({binary} not found): {INSTALL_HINT}")
    return binary


class Browser:
    """One headless Chromium and one page of it, over CDP."""

    def __init__(self, profile_dir: str, binary: str | None = None):
        self.profile_dir = str(profile_dir)
        self.log_path = os.path.join(self.profile_dir, "chromium.log")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    binary or chromium_binary(),
                    "--headless=new",
                    "--no-sandbox",  # root cannot use Chromium's sandbox (CI runs as root)
                    "--disable-gpu",
                    f"--user-data-dir={self.profile_dir}",
                    "--remote-debugging-port=0",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--window-size=1280,900",
                    "about:blank",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._next_id = 0
        self.events: list[dict] = []
        try:
            port = self._wait_for_port()
            self.socket = connect(self._page_websocket(port), max_size=None, open_timeout=_START_TIMEOUT_S)
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _wait_for_port(self) -> int:
        path = os.path.join(self.profile_dir, "DevToolsActivePort")
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Chromium exited ({self.process.returncode}): {self._log_tail()}")
            if os.path.exists(path):
                with open(path) as handle:
                    first = handle.readline().strip()
                if first.isdigit():
                    return int(first)
            time.sleep(0.05)
        raise RuntimeError(
            f"Chromium did not open its DevTools port in {_START_TIMEOUT_S} s: {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        with open(self.log_path, errors="replace") as handle:
            return handle.read()[-2000:]

    @staticmethod
    def _page_websocket(port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            targets = json.load(response)
        return next(target["webSocketDebuggerUrl"] for target in targets if target["type"] == "page")

    def call(self, method: str, timeout: float = 30, **params) -> dict:
        """Send one CDP command and return its result; events that arrive meanwhile are kept."""
        self._next_id += 1
        self.socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.socket.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for_event(self, method: str, timeout: float = 30) -> dict:
        """The next event called `method` (from those kept, or as it arrives)."""
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(index)
            self.events.append(json.loads(self.socket.recv(timeout=max(0.01, deadline - time.monotonic()))))

    def open(self, path: str, timeout: float = 30):
        """Navigate to a local file and wait for its load event (every image decoded or failed)."""
        self.events.clear()
        self.call("Page.navigate", url="file://" + os.path.abspath(path))
        self.wait_for_event("Page.loadEventFired", timeout)

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression in the page; RuntimeError if it throws."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """What the page reported as wrong since it was opened: console errors, exceptions, error log entries."""
        self.call("Runtime.evaluate", expression="0")  # drains events sent before this point
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url', '')})")
        return found

    def screenshot(self, path: str):
        """A PNG of the whole page (not only the window)."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        result = self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        )
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(result["data"]))

    def close(self):
        socket = getattr(self, "socket", None)
        if socket is not None:
            socket.close()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own group: the browser and its children
        except ProcessLookupError:
            pass  # the whole group has exited already
        self.process.wait(timeout=30)
