"""Servers a bench starts: a child process with its log, waited for until it is ready, stopped by
a signal (SIGKILL when it does not exit in time)."""
import http.client
import os
import re
import signal
import socket
import subprocess
import time

from . import MODEL
from .ports import free_port


class NotReady(RuntimeError):
    """A server exited, or did not get ready in time; the message names its log."""


class Process:
    """One child process, its output (stdout and stderr) in log_path (None: discarded).
    stop() signals it and waits; a Process is also a context manager that stops it."""

    def __init__(self, cmd, log_path=None, env=None, append=False, new_session=False, name=None):
        self.cmd = list(cmd)
        self.name = name or os.path.basename(self.cmd[0])
        self.log_path = log_path
        self.log = open(log_path, "ab" if append else "wb") if log_path else None
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                     stdout=self.log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=new_session)
        self.pid = self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def wait_ready(self, ready, timeout, interval=0.1):
        """Polls ready() until it returns true; raises NotReady if the process exits first or
        timeout seconds pass (and stops it). Returns the seconds it took."""
        t0 = time.monotonic()
        while True:
            if not self.alive():
                raise NotReady(f"{self.name} exited {self.proc.returncode} before it was ready"
                               + (f"; see {self.log_path}" if self.log_path else ""))
            try:
                if ready():
                    return time.monotonic() - t0
            except OSError:
                pass
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise NotReady(f"{self.name} not ready within {timeout:g} s"
                               + (f"; see {self.log_path}" if self.log_path else ""))
            time.sleep(interval)

    def stop(self, timeout=30.0, sig=signal.SIGTERM):
        """Sends sig and waits up to timeout seconds, then SIGKILL. Returns (exit status, killed).
        Stopping a stopped process does nothing."""
        killed = False
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                killed = True
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.log:
            self.log.close()
            self.log = None
        return self.proc.returncode, killed

    def log_text(self, offset=0):
        """The log from byte offset on (text)."""
        if self.log:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_size(self):
        if self.log:
            self.log.flush()
        return os.path.getsize(self.log_path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def http_ready(port, path="/health", host="127.0.0.1"):
    """A ready() for wait_ready: GET path answers 200."""
    def ready():
        c = http.client.HTTPConnection(host, port, timeout=5)
        try:
            c.request("GET", path)
            return c.getresponse().status == 200
        finally:
            c.close()
    return ready


def tcp_ready(port, host="127.0.0.1"):
    """A ready() for wait_ready: something accepts connections on port."""
    def ready():
        socket.create_connection((host, port), 0.2).close()
        return True
    return ready


def redis_ping(port, host="127.0.0.1"):
    """A ready() for wait_ready: redis answers PING (a loading redis accepts, but answers -LOADING)."""
    def ready():
        with socket.create_connection((host, port), 2) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    return ready


def log_says(process, pattern):
    """A ready() for wait_ready: the process's log matches pattern (a regular expression)."""
    return lambda: re.search(pattern, process.log_text()) is not None


def serve(binary, log_path, flags=(), model=MODEL, port=None, timeout=300, env=None):
    """`swarmkv serve` on a loopback port (default: a free one) with flags, ready when /health
    answers; its port in .port."""
    port = port or free_port()
    p = Process([binary, "serve", "--port", str(port), "--model", model, *flags], log_path, env=env,
                name=f"{os.path.basename(binary)} serve")
    p.port = port
    p.wait_ready(http_ready(port), timeout, interval=0.5)
    return p


def redis(port=None, args=(), binary="redis-server", log_path=None, timeout=10, env=None, ready=None,
          new_session=False):
    """A redis-server on loopback that keeps nothing on disk (--save "" --appendonly no), with args
    after those; ready when it answers PING (or ready(port), e.g. for TLS). Its port in .port."""
    port = port or free_port()
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
           "--loglevel", "warning", *args]
    p = Process(cmd, log_path, env=env, new_session=new_session, name="redis-server")
    p.port = port
    p.wait_ready(ready(port) if ready else redis_ping(port), timeout, interval=0.05)
    return p
