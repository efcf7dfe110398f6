"""A tiny headless-browser driver for tests: Debian's chromium over the Chrome DevTools Protocol.

Why CDP over ``websocket-client`` and not selenium or playwright: those bring their own browser
builds or drivers (chromedriver, playwright's bundled Chromium) and fetch them at install or first
run, which this project's machines cannot do. Chromium itself speaks CDP on a websocket, so all a
test needs is the Debian package (``bash scripts/setup-browser.sh`` installs it) and the small
pure-Python ``websocket-client``. The few CDP commands used here have been stable for years.

Usage::

    with Browser() as b:
        b.set_cookie("session", token, "http://127.0.0.1:8080/")
        b.goto("http://127.0.0.1:8080/plugin")
        b.wait_for_text("Kinetic jobs")  # also searches same-origin iframes
        b.screenshot("/tmp/page.png")

One page target per ``Browser``; each ``Browser`` is its own chromium process with a throwaway
profile, so cookies and storage never leak between tests.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import websocket

SETUP_HINT = "bash scripts/setup-browser.sh"

# Headless chromium as root needs --no-sandbox; the rest keeps it quiet, small and off the network
# (no component updates, sync, metrics or first-run UI: these machines reach no such service).
_BASE_ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--metrics-recording-only",
    "--mute-audio",
    "--password-store=basic",
)

# Concatenated document.body.innerText of the top document and, recursively, of every iframe whose
# document this one may read (same origin); cross-origin frames are skipped (contentDocument is null).
_ALL_TEXT_JS = """(() => {
  const out = [];
  const walk = (doc) => {
    if (!doc) return;
    if (doc.body) out.push(doc.body.innerText);
    for (const f of doc.querySelectorAll('iframe, frame')) {
      let sub = null;
      try { sub = f.contentDocument; } catch (e) { sub = null; }
      walk(sub);
    }
  };
  walk(document);
  return out.join('\\n');
})()"""

_FRAME_TEXT_JS = """((sel) => {
  const f = document.querySelector(sel);
  if (!f) throw new Error('no element matches ' + sel);
  let doc = null;
  try { doc = f.contentDocument; } catch (e) { doc = null; }
  if (!doc) throw new Error(sel + ' is not a same-origin frame (or has no document yet)');
  return doc.body ? doc.body.innerText : '';
})(%s)"""

# Click the innermost visible element (in the page or a same-origin frame) whose text contains the
# needle, or its nearest clickable ancestor. Returns false when there is none (yet).
_CLICK_TEXT_JS = """((needle) => {
  const visible = (el) => el.getClientRects().length > 0;
  const own = (el) => (el.tagName === 'INPUT' ? (el.value || '') : (el.innerText || ''));
  const find = (doc) => {
    if (!doc || !doc.body) return null;
    let best = null;
    for (const el of doc.body.querySelectorAll('*')) {
      if (visible(el) && own(el).includes(needle)) best = el;  // later in document order = deeper
    }
    if (best) return best;
    for (const f of doc.querySelectorAll('iframe, frame')) {
      let sub = null;
      try { sub = f.contentDocument; } catch (e) { sub = null; }
      const hit = find(sub);
      if (hit) return hit;
    }
    return null;
  };
  const el = find(document);
  if (!el) return false;
  const target = el.closest('a, button, input, label, summary, select, [role=button], [onclick]') || el;
  target.scrollIntoView({block: 'center'});
  target.click();
  return true;
})(%s)"""


class BrowserError(RuntimeError):
    """Chromium is missing, did not start, died, or a CDP command failed."""


class CDPError(BrowserError):
    """A CDP command answered with an error."""


class JavaScriptError(BrowserError):
    """Runtime.evaluate threw (or the promise it awaited rejected)."""


def find_chromium() -> str | None:
    """Path of the chromium to use ($CHROMIUM, else `chromium` on PATH), or None: for skip logic."""
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env)
    return shutil.which("chromium")


def _shutdown(proc: subprocess.Popen[bytes], tmpdir: str, grace: float) -> None:
    """Stop chromium's whole process group (renderers, zygote too) and remove its profile dir."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)
    # The main process is gone (and reaped); make sure no child of it outlives it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    shutil.rmtree(tmpdir, ignore_errors=True)


class Browser:
    """A headless chromium with one page, driven over CDP. Use as a context manager."""

    def __init__(
        self,
        *,
        binary: str | None = None,
        window_size: tuple[int, int] = (1400, 900),
        startup_timeout: float = 30.0,
        command_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.window_size = window_size
        self.startup_timeout = startup_timeout
        self.command_timeout = command_timeout
        self.extra_args = tuple(extra_args)
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmpdir: str | None = None
        self._ws: websocket.WebSocket | None = None
        self._next_id = 0
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=2000)
        self._finalizer: weakref.finalize | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Browser:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start chromium, find its DevTools endpoint and attach to a fresh page target."""
        if self._proc is not None:
            raise BrowserError("Browser already started")
        binary = shutil.which(self.binary) if self.binary else find_chromium()
        if binary is None:
            raise BrowserError(
                f"chromium not found ({self.binary or os.environ.get('CHROMIUM') or 'chromium'} "
                f"is not on PATH): run `{SETUP_HINT}` (installs Debian's chromium)"
            )
        self._tmpdir = tempfile.mkdtemp(prefix="kinetic-browser-")
        stderr_path = Path(self._tmpdir, "chromium.log")
        width, height = self.window_size
        args = [
            binary,
            *_BASE_ARGS,
            f"--user-data-dir={self._tmpdir}/profile",
            f"--window-size={width},{height}",
            *self.extra_args,
            "about:blank",
        ]
        try:
            with stderr_path.open("wb") as log:
                # Own process group, so close() can end chromium's helpers with it.
                self._proc = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._finalizer = weakref.finalize(self, _shutdown, self._proc, self._tmpdir, 5.0)
            browser_ws = self._wait_devtools_url()
            target_id = self._create_page_target(browser_ws)
            self._ws = self._connect(f"ws://127.0.0.1:{self.port}/devtools/page/{target_id}")
            self.send("Page.enable")
            self._events.clear()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the websocket, stop chromium (SIGTERM, SIGKILL after 5 s), remove the tmp dir."""
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self._ws.close(timeout=1)
            self._ws = None
        if self._finalizer is not None:
            self._finalizer()  # runs _shutdown once; also runs at exit if close() never does
            self._finalizer = None
        elif self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        self._proc = None
        self._tmpdir = None

    def _log_tail(self, limit: int = 3000) -> str:
        if self._tmpdir is None:
            return ""
        try:
            text = Path(self._tmpdir, "chromium.log").read_text(errors="replace")
        except OSError:
            return ""
        return text[-limit:]

    def _wait_devtools_url(self) -> str:
        """Browser websocket URL, from the DevToolsActivePort file chromium writes in its profile."""
        assert self._proc is not None and self._tmpdir is not None
        port_file = Path(self._tmpdir, "profile", "DevToolsActivePort")
        deadline = time.monotonic() + self.startup_timeout
        while True:
            with contextlib.suppress(OSError):
                lines = port_file.read_text().split()
                if len(lines) >= 2 and lines[0].isdigit():
                    self.port = int(lines[0])
                    return f"ws://127.0.0.1:{self.port}{lines[1]}"
            code = self._proc.poll()
            if code is not None:
                raise BrowserError(f"chromium exited with code {code} at startup:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise BrowserError(
                    f"chromium wrote no DevToolsActivePort within {self.startup_timeout:g} s:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.05)

    def _connect(self, url: str) -> websocket.WebSocket:
        # No Origin header: chromium refuses websocket clients that send an origin it was not
        # told to allow (--remote-allow-origins), and a test client has no origin anyway.
        return websocket.create_connection(url, timeout=self.command_timeout, suppress_origin=True)

    def _create_page_target(self, browser_ws_url: str) -> str:
        ws = self._connect(browser_ws_url)
        try:
            ws.send(json.dumps({"id": 1, "method": "Target.createTarget", "params": {"url": "about:blank"}}))
            deadline = time.monotonic() + self.command_timeout
            while True:
                ws.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    msg = json.loads(ws.recv())
                except websocket.WebSocketTimeoutException:
                    raise BrowserError("Target.createTarget: no answer from chromium") from None
                if msg.get("id") == 1:
                    if "error" in msg:
                        raise CDPError(f"Target.createTarget: {msg['error']}")
                    return str(msg["result"]["targetId"])
        finally:
            ws.close()

    # -- CDP plumbing ---------------------------------------------------------------------------

    def _recv(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        """One message from the page socket; raises on timeout, a closed socket or a crash."""
        if self._ws is None:
            raise BrowserError("Browser is not started (use `with Browser() as b:`)")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out waiting for {waiting_for}")
        self._ws.settimeout(remaining)
        try:
            raw = self._ws.recv()
        except websocket.WebSocketTimeoutException:
            raise TimeoutError(f"timed out waiting for {waiting_for}") from None
        except (websocket.WebSocketException, OSError) as e:
            raise BrowserError(f"lost chromium while waiting for {waiting_for}: {e}\n{self._log_tail()}")
        msg: dict[str, Any] = json.loads(raw)
        method = msg.get("method")
        if method in ("Inspector.targetCrashed", "Inspector.detached"):
            raise BrowserError(f"{method} while waiting for {waiting_for}: {msg.get('params')}")
        if method == "Page.javascriptDialogOpening":
            # An alert()/confirm() would block every later command: accept it, don't wait for the
            # answer (its unmatched id is skipped like any other stray response).
            self._next_id += 1
            self._ws.send(
                json.dumps(
                    {"id": self._next_id, "method": "Page.handleJavaScriptDialog", "params": {"accept": True}}
                )
            )
        return msg

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Send one CDP command and return its result; events that arrive meanwhile are buffered."""
        if self._ws is None:
            raise BrowserError("Browser is not started (use `with Browser() as b:`)")
        self._next_id += 1
        msg_id = self._next_id
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + (self.command_timeout if timeout is None else timeout)
        while True:
            msg = self._recv(deadline, f"the answer to {method}")
            if "method" in msg:
                self._events.append(msg)
            elif msg.get("id") == msg_id:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error'].get('message')} ({msg['error']})")
                return msg.get("result", {})
            # else: the answer to a command nobody waits for (a dialog accept): skip it

    def wait_event(
        self,
        method: str,
        timeout: float = 30,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """Params of the first (buffered or new) event named `method` that satisfies `predicate`."""
        for i, ev in enumerate(self._events):
            if ev["method"] == method and (predicate is None or predicate(ev.get("params", {}))):
                del self._events[i]
                return ev.get("params", {})
        deadline = time.monotonic() + timeout
        while True:
            msg = self._recv(deadline, f"event {method}")
            if msg.get("method") == method and (predicate is None or predicate(msg.get("params", {}))):
                return msg.get("params", {})
            if "method" in msg:
                self._events.append(msg)

    # -- page API -------------------------------------------------------------------------------

    def set_cookie(self, name: str, value: str, url: str) -> None:
        """Set a cookie for `url` (host-only, path / unless the url says otherwise)."""
        result = self.send("Network.setCookie", {"name": name, "value": value, "url": url})
        if result.get("success") is False:
            raise BrowserError(f"Network.setCookie refused {name!r} for {url}")

    def goto(self, url: str, timeout: float = 30) -> None:
        """Navigate the page to `url` and wait for its load event (iframes included)."""
        deadline = time.monotonic() + timeout
        self._events = collections.deque(
            (e for e in self._events if e["method"] != "Page.loadEventFired"), maxlen=self._events.maxlen
        )
        result = self.send("Page.navigate", {"url": url}, timeout=timeout)
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url} failed: {result['errorText']}")
        if "loaderId" not in result:
            return  # same-document navigation (a #fragment): no load event comes
        self.wait_event("Page.loadEventFired", timeout=max(0.01, deadline - time.monotonic()))

    def evaluate(self, js: str, timeout: float | None = None) -> Any:
        """Value of the JS expression `js` in the top document (promises awaited, JSON-ish value)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": js, "returnByValue": True, "awaitPromise": True, "userGesture": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            exc = details.get("exception", {})
            message = exc.get("description") or exc.get("value") or details.get("text")
            raise JavaScriptError(f"JS threw: {message}")
        return result.get("result", {}).get("value")

    def text(self, frame_selector: str | None = None) -> str:
        """document.body.innerText of the page, or of the same-origin iframe `frame_selector` picks."""
        if frame_selector is None:
            return str(self.evaluate("document.body ? document.body.innerText : ''"))
        return str(self.evaluate(_FRAME_TEXT_JS % json.dumps(frame_selector)))

    def all_text(self) -> str:
        """Text of the page plus that of every same-origin iframe in it, recursively."""
        return str(self.evaluate(_ALL_TEXT_JS))

    def wait_for_text(self, needle: str, timeout: float = 30, include_frames: bool = True) -> str:
        """Poll (every 0.25 s) until the page text contains `needle`; return that text."""
        deadline = time.monotonic() + timeout
        last = ""
        last_error: BaseException | None = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                js = _ALL_TEXT_JS if include_frames else "document.body ? document.body.innerText : ''"
                last = str(self.evaluate(js, timeout=max(0.5, remaining)))
                last_error = None
                if needle in last:
                    return last
            except (CDPError, JavaScriptError, TimeoutError) as e:
                # Mid-navigation the page's context can vanish under an evaluate: try again.
                last_error = e
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(0.25, remaining))
        where = "page and its same-origin frames" if include_frames else "page"
        note = f"\n(last error: {last_error})" if last_error else ""
        raise AssertionError(
            f"{needle!r} not in the {where} text within {timeout:g} s; last text:\n{last}{note}"
        )

    def click_text(self, text: str, timeout: float = 30) -> None:
        """Click the innermost visible element whose text contains `text` (or its clickable parent)."""
        deadline = time.monotonic() + timeout
        js = _CLICK_TEXT_JS % json.dumps(text)
        while not self.evaluate(js, timeout=max(0.5, deadline - time.monotonic())):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no visible element with text {text!r} within {timeout:g} s")
            time.sleep(min(0.25, remaining))

    def screenshot(self, path: str | os.PathLike[str]) -> Path:
        """Write a PNG of the viewport to `path` and return it."""
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(data))
        return out
