"""`accel serve`: one device (fsim, tsim, rtl, vboard or board) behind an authenticated RPC server.

    srv = DeviceServer("default", driver="board", host="127.0.0.1", port=9091, token=tok)
    srv.serve_forever()            # or srv.start() (a background thread) ... srv.close()

Security model (docs/board.md): binds the loopback address unless told otherwise and refuses any
other address without a token; a client proves the token with an HMAC of a fresh nonce, checked
with hmac.compare_digest, before any other request is read; frames have size limits (a small
one before authentication) checked before their bytes are read, and every read a timeout; a
request carries data only (a DRAM image holding an instruction program, run by the device's
driver): there is no request that loads or executes native code (a compiled model's CPU steps
run on the client). Runs queue on one lock (one device); malformed frames, failed runs and
dropped connections end at most that connection. Each request is logged.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
import socketserver
import threading
import time

import numpy as np

from accel.isa import AccelConfig, AccelError, resolve_config

from .device import get_driver
from .errors import HostRuntimeError
from .remote import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_PORT,
    PAGE,
    PROTOCOL_VERSION,
    ProtocolError,
    auth_proof,
    changed_pages,
    pack_pages,
    padded,
    recv_frame,
    send_frame,
    unpack_pages,
)

log = logging.getLogger(__name__)

PRE_AUTH_HEADER = 4096        # bytes of the one frame an unauthenticated client may send
SERVE_DRIVERS = ("fsim", "tsim", "rtl", "vboard", "board")


class ServerError(HostRuntimeError):
    """The server cannot start as asked (an address without a token, a bad limit, a driver that fails)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 16

    def __init__(self, addr, app: "DeviceServer"):
        self.app = app
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, _Handler)

    def handle_error(self, request, client_address):   # never a traceback on stderr for a client's fault
        log.exception("client %s: unexpected error", client_address)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        self.server.app._serve_client(self.request, self.client_address)


class DeviceServer:
    """Serves one device. driver: a name of SERVE_DRIVERS (driver_options go to it); token: None
    allows only a loopback host. Limits: max_payload (DRAM image bytes), request_timeout_s (the
    rest of a frame once its first byte came; the handshake), idle_timeout_s (between requests),
    queue_timeout_s (waiting for the device), max_clients (connections at once)."""

    def __init__(self, config: AccelConfig | str | None = None, driver: str = "fsim", host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, token: str | None = None, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 request_timeout_s: float = 30.0, idle_timeout_s: float = 600.0, queue_timeout_s: float = 600.0,
                 max_clients: int = 8, **driver_options):
        self.cfg = resolve_config(config)
        if driver not in SERVE_DRIVERS:
            raise ServerError(f"--driver {driver!r}: a server exposes one of {', '.join(SERVE_DRIVERS)}")
        if not is_loopback(host) and not token:
            raise ServerError(f"refusing to listen on {host} without a token: other machines could run programs "
                              f"on the device; give --token-file (or ACCEL_TOKEN), or bind 127.0.0.1")
        if token is not None and len(token) < 16:
            raise ServerError("the token is shorter than 16 characters; use e.g. `python -c \"import secrets; "
                              "print(secrets.token_hex(32))\"`")
        if type(max_payload) is not int or not 0 < max_payload <= min(1 << self.cfg.dram_addr_width, 4 << 30):
            raise ServerError(f"max_payload={max_payload}: must be 1..min(4 GiB, 2**dram_addr_width)")
        for name, v in (("request_timeout_s", request_timeout_s), ("idle_timeout_s", idle_timeout_s),
                        ("queue_timeout_s", queue_timeout_s)):
            if not v > 0:
                raise ServerError(f"{name}={v}: must be > 0")
        if not 1 <= max_clients <= 1024:
            raise ServerError(f"max_clients={max_clients}: must be 1..1024")
        self.token = token
        self.max_payload = int(max_payload)
        self._max_frame = self.max_payload + 4 * (self.max_payload // PAGE + 1) + 4   # a page blob's indices
        self.request_timeout_s, self.idle_timeout_s = float(request_timeout_s), float(idle_timeout_s)
        self.queue_timeout_s = float(queue_timeout_s)
        self.driver_name = driver
        self.driver = get_driver(driver, self.cfg, **driver_options)
        self._device_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_clients)
        self.requests = 0
        try:
            self._tcp = _TCPServer((host, port), self)
        except OSError as e:
            self.driver.close()
            raise ServerError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        self._thread: threading.Thread | None = None
        log.info("serving driver %s (config %s) on %s:%d, %s", driver, self.cfg.digest()[:12], *self.address[:2],
                 "token required" if token else "no token (loopback only)")

    @property
    def address(self) -> tuple:
        return self._tcp.server_address

    def serve_forever(self) -> None:
        self._tcp.serve_forever(poll_interval=0.2)

    def start(self) -> "DeviceServer":
        """Serve from a background thread (tests, embedding)."""
        self._thread = threading.Thread(target=self.serve_forever, name="accel-serve", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._tcp.shutdown() if self._thread is not None else None
        self._tcp.server_close()
        with self._device_lock:
            self.driver.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- one connection ------------------------------------------------------------------------
    def _serve_client(self, conn: socket.socket, peer) -> None:
        who = f"{peer[0]}:{peer[1]}"
        if not self._slots.acquire(blocking=False):
            log.warning("client %s refused: too many connections", who)
            self._send_error(conn, who, "too many clients connected; try again later")
            return
        try:
            conn.settimeout(self.request_timeout_s)
            if not self._handshake(conn, who):
                return
            session: dict = {}        # the DRAM image this connection's last run left ("image")
            while True:
                conn.settimeout(self.idle_timeout_s)
                try:
                    header, payload = recv_frame(conn, max_payload=self._max_frame,
                                                 body_timeout=self.request_timeout_s)
                except EOFError:
                    log.info("client %s disconnected", who)
                    return
                except ProtocolError as e:
                    log.warning("client %s: %s; closing", who, e)
                    self._send_error(conn, who, str(e))
                    return
                if not self._request(conn, who, header, payload, session):
                    return
        except socket.timeout:
            log.warning("client %s: timed out; closing", who)
        except OSError as e:
            log.info("client %s: connection lost (%s)", who, e)
        finally:
            self._slots.release()
            try:
                conn.close()
            except OSError:
                pass

    def _send_error(self, conn, who: str, message: str) -> None:
        try:
            conn.settimeout(5)
            send_frame(conn, {"type": "error", "message": message})
        except OSError:
            log.info("client %s: could not send the error (%s)", who, message)

    def _handshake(self, conn, who: str) -> bool:
        nonce = os.urandom(32)
        send_frame(conn, {"type": "hello", "version": PROTOCOL_VERSION, "nonce": nonce.hex(),
                          "config": self.cfg.to_dict(), "digest": self.cfg.digest(), "driver": self.driver_name,
                          "auth": self.token is not None, "max_payload": self.max_payload})
        try:
            header, _ = recv_frame(conn, max_header=PRE_AUTH_HEADER, max_payload=0,
                                   body_timeout=self.request_timeout_s)
        except EOFError:
            log.info("client %s left before authenticating", who)
            return False
        except ProtocolError as e:
            log.warning("client %s: %s before authentication; closing", who, e)
            self._send_error(conn, who, str(e))
            return False
        proof = header.get("proof")
        if header.get("type") != "auth" or not isinstance(proof, str):
            log.warning("client %s: first frame is not an auth frame; closing", who)
            self._send_error(conn, who, "the first request must be {'type': 'auth', 'proof': ...}")
            return False
        if self.token is not None and not hmac.compare_digest(proof.encode(), auth_proof(self.token, nonce).encode()):
            log.warning("client %s: authentication failed", who)
            time.sleep(0.2)   # slows guessing; the nonce makes each try independent
            self._send_error(conn, who, "authentication failed")
            return False
        send_frame(conn, {"type": "welcome"})
        log.info("client %s authenticated", who)
        return True

    def _request(self, conn, who: str, header: dict, payload: bytearray, session: dict) -> bool:
        """Handle one request; False ends the connection."""
        kind = header["type"]
        self.requests += 1
        t0 = time.perf_counter()
        if kind == "ping":
            send_frame(conn, {"type": "pong"})
            log.info("client %s: ping", who)
            return True
        if kind != "run":
            log.warning("client %s: unknown request type %r", who, kind[:40])
            self._send_error(conn, who, f"unknown request type {kind[:40]!r}; requests are run, ping")
            return True
        try:
            addr, count, image, nbytes = self._check_run(header, payload, session.get("image"))
            session.pop("image", None)     # a failed run leaves no image to patch (the client sends it whole)
        except (ValueError, ProtocolError) as e:
            log.warning("client %s: run refused: %s", who, e)
            self._send_error(conn, who, f"run refused: {e}")
            return True
        before = image.copy()
        dram = image[:nbytes]
        if not self._device_lock.acquire(timeout=self.queue_timeout_s):
            log.warning("client %s: device busy for %.0f s", who, self.queue_timeout_s)
            self._send_error(conn, who, f"the device stayed busy for {self.queue_timeout_s:g} s; try again")
            return True
        try:
            waited = time.perf_counter() - t0
            result = self.driver.run(dram, addr, count)
        except AccelError as e:
            log.warning("client %s: run of %d instructions failed: %s", who, count, e)
            self._send_error(conn, who, f"run failed: {e}")
            return True
        except Exception as e:   # a driver bug must not take the server down
            log.exception("client %s: run of %d instructions crashed", who, count)
            self._send_error(conn, who, f"run failed: internal error {type(e).__name__}")
            return True
        finally:
            self._device_lock.release()
        pages = changed_pages(image, before)
        log.info("client %s: run %d instructions at %#x, %d DRAM bytes (%s, %d bytes in): %s cycles, %d pages "
                 "changed, queued %.3f s, %.3f s", who, count, addr, nbytes, header.get("encoding"), len(payload),
                 result.cycles, len(pages), waited, time.perf_counter() - t0)
        send_frame(conn, {"type": "result", "result": _plain(result.to_dict())}, pack_pages(image, pages))
        session["image"] = image
        return True

    def _check_run(self, header: dict, payload: bytearray, kept: np.ndarray | None):
        """(insn_addr, insn_count, page-padded image, DRAM bytes) of a run request, or ValueError."""
        if header.get("digest") != self.cfg.digest():
            raise ValueError(f"config digest {str(header.get('digest'))[:16]!r} is not the device's "
                             f"({self.cfg.digest()[:12]}); compile for the server's config")
        vals = []
        for key in ("insn_addr", "insn_count", "dram_bytes"):
            v = header.get(key)
            if type(v) is not int or v < 0:
                raise ValueError(f"field {key} must be a non-negative integer, got {str(v)[:20]!r}")
            vals.append(v)
        addr, count, nbytes = vals
        if not 0 < nbytes <= self.max_payload:
            raise ValueError(f"dram_bytes={nbytes}: must be 1..{self.max_payload} (accel serve --max-bytes)")
        if nbytes > 1 << self.cfg.dram_addr_width:
            raise ValueError(f"a {nbytes}-byte DRAM exceeds the config's {self.cfg.dram_addr_width}-bit addresses")
        if addr % 16 or addr + 16 * count > nbytes or count == 0:
            raise ValueError(f"instructions [{addr:#x}, +{count}x16) do not lie in the {nbytes}-byte DRAM image "
                             f"(insn_addr a multiple of 16, insn_count >= 1)")
        encoding = header.get("encoding")
        size = padded(nbytes)
        if encoding == "full":
            if len(payload) != nbytes:
                raise ValueError(f"a full image of dram_bytes={nbytes} bytes came with {len(payload)} bytes")
            image = np.zeros(size, np.uint8)
            image[:nbytes] = np.frombuffer(payload, np.uint8)
            return addr, count, image, nbytes
        if encoding == "pages":
            if kept is None or kept.size != size:
                raise ValueError("encoding 'pages' needs the image of this connection's last successful run of the "
                                 "same size; send it 'full'")
            idx, data = unpack_pages(payload, size // PAGE)
            kept.reshape(-1, PAGE)[idx] = data
            if nbytes < size:
                kept[nbytes:] = 0
            return addr, count, kept, nbytes
        raise ValueError(f"field encoding must be 'full' or 'pages', got {str(encoding)[:20]!r}")


def _plain(obj):
    """JSON-safe copy of a driver's stats (numpy scalars to Python numbers)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (int, float, str, bool)):
        return obj
    return str(obj)
