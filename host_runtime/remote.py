"""Remote devices: the client of `accel serve` (host_runtime/server.py) and the wire format both use.

    Device("remote://board.local:9091")                  # config from the server
    Device(cfg, driver="remote://127.0.0.1:9091", token_file="~/.accel-token")
    accel run net.accm --driver remote://HOST:PORT --token-file F     (or ACCEL_TOKEN=...)

Framing (no pickle, nothing executable): a frame is <4s magic "ACRP", u32 header length,
u32 payload length> (little-endian), a UTF-8 JSON object, then raw payload bytes. Sizes are
checked before anything is read. The server greets with {"type": "hello", "nonce", "config",
"digest", "driver", "auth", "max_payload"}; the client answers {"type": "auth", "proof":
hex HMAC-SHA256(token, "accel-rpc-v1" + nonce)} (the token itself never crosses the wire).
Requests: {"type": "run", "digest", "insn_addr", "insn_count", "dram_bytes", "encoding"}:
"full" sends the DRAM image as payload, "pages" only the 4 KiB pages that differ from the image
the server kept from this connection's last run (<u32 n, n x u32 index, n x 4096 bytes>); the
answer {"type": "result", "result": RunResult.to_dict()} carries the pages the run changed, in
the same packing. A failed run drops the kept image (the next run sends it whole). {"type":
"ping"} -> {"type": "pong"}; any failure -> {"type": "error", "message"}.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import socket
import struct
import time
from pathlib import Path

import numpy as np

from accel.isa import AccelConfig
from sim.trace import SCHEMA, Counters, StageCounters, TimingRun

from .device import Driver, RunResult
from .errors import DriverError

log = logging.getLogger(__name__)

PREFIX = "remote://"
MAGIC = b"ACRP"
PROTOCOL_VERSION = 1
FRAME = struct.Struct("<4sII")
DEFAULT_PORT = 9091
MAX_HEADER = 64 << 10                 # bytes of a frame's JSON header
DEFAULT_MAX_PAYLOAD = 256 << 20       # bytes of a DRAM image
AUTH_CONTEXT = b"accel-rpc-v1"


class RemoteError(DriverError):
    """A remote device failed: unreachable, refused authentication, a protocol violation, or the
    server's own error (the message names the server and what it said)."""


class ProtocolError(RemoteError):
    """A frame that breaks the wire format: bad magic, a size over its limit, bad JSON, or a cut stream."""


# ---- framing ---------------------------------------------------------------------------------------
def send_frame(sock: socket.socket, header: dict, payload=b"") -> None:
    head = json.dumps(header, separators=(",", ":")).encode()
    body = memoryview(payload).cast("B") if not isinstance(payload, (bytes, bytearray)) else payload
    sock.sendall(FRAME.pack(MAGIC, len(head), len(body)) + head)
    if len(body):
        sock.sendall(body)


MIN_RATE = 1 << 20        # bytes/s a frame's payload must at least arrive at (on top of the frame timeout)


def _recv_exact(sock: socket.socket, n: int, what: str, deadline: float | None = None) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout(f"the {what} did not arrive in time ({got} of {n} bytes)")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], min(n - got, 1 << 20))
        if k == 0:
            raise ProtocolError(f"connection closed after {got} of {n} bytes of the {what}")
        got += k
    return buf


def recv_frame(sock: socket.socket, max_header: int = MAX_HEADER, max_payload: int = DEFAULT_MAX_PAYLOAD,
               body_timeout: float | None = None) -> tuple[dict, bytearray]:
    """One frame: (header dict, payload). The socket's own timeout applies to the first byte;
    with body_timeout the rest of the frame must arrive within body_timeout seconds in all (plus
    a second per MiB of payload), however slowly its bytes trickle in."""
    first = sock.recv(1)
    if not first:
        raise EOFError("connection closed")
    deadline = None if body_timeout is None else time.monotonic() + body_timeout
    raw = bytes(first) + bytes(_recv_exact(sock, FRAME.size - 1, "frame prefix", deadline))
    magic, hlen, plen = FRAME.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r} (expected {MAGIC!r}): not an accel RPC peer")
    if hlen > max_header:
        raise ProtocolError(f"frame header of {hlen} bytes exceeds the limit of {max_header}")
    if plen > max_payload:
        raise ProtocolError(f"frame payload of {plen} bytes exceeds the limit of {max_payload}")
    if deadline is not None:
        deadline += plen / MIN_RATE
    try:
        header = json.loads(bytes(_recv_exact(sock, hlen, "frame header", deadline)).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("frame header is not UTF-8 JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError("frame header is not a JSON object with a string 'type'")
    return header, _recv_exact(sock, plen, "payload", deadline) if plen else bytearray()


# ---- DRAM pages (a run sends and returns only the pages that differ) ----------------------------------
PAGE = 4096


def padded(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE


def changed_pages(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Indices of the PAGE-byte pages where two equally long, page-padded images differ."""
    return np.flatnonzero((new.reshape(-1, PAGE) != old.reshape(-1, PAGE)).any(axis=1)).astype(np.uint32)


def pack_pages(image: np.ndarray, pages: np.ndarray) -> bytes:
    """<u32 n> <n x u32 page index> <n x PAGE bytes>, from a page-padded image."""
    data = image.reshape(-1, PAGE)[pages]
    return struct.pack("<I", len(pages)) + pages.astype("<u4").tobytes() + data.tobytes()


def unpack_pages(blob: bytes | bytearray, npages: int) -> tuple[np.ndarray, np.ndarray]:
    """(page indices, (n, PAGE) data) of a packed blob, checked: length, indices increasing and < npages."""
    if len(blob) < 4:
        raise ProtocolError("page blob shorter than its count")
    (n,) = struct.unpack_from("<I", blob)
    if len(blob) != 4 + n * (4 + PAGE):
        raise ProtocolError(f"page blob of {len(blob)} bytes does not hold the {n} pages it announces")
    idx = np.frombuffer(blob, "<u4", count=n, offset=4).astype(np.int64)
    if n and (idx[-1] >= npages or np.any(np.diff(idx) <= 0)):
        raise ProtocolError(f"page indices must increase and stay below {npages}")
    return idx, np.frombuffer(blob, np.uint8, count=n * PAGE, offset=4 + 4 * n).reshape(n, PAGE)


# ---- tokens and addresses --------------------------------------------------------------------------
def parse_url(url: str) -> tuple[str, int]:
    """remote://HOST:PORT (HOST may be [v6]) -> (host, port)."""
    m = re.fullmatch(r"remote://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]+)(?::(\d{1,5}))?/?", url)
    if not m:
        raise RemoteError(f"driver {url!r}: expected remote://HOST:PORT")
    port = int(m.group(2) or DEFAULT_PORT)
    if not 0 < port < 65536:
        raise RemoteError(f"driver {url!r}: port {port} is outside 1..65535")
    return m.group(1).strip("[]"), port


def read_token_file(path: str | os.PathLike) -> str:
    p = Path(path).expanduser()
    try:
        if p.stat().st_size > 4096:
            raise RemoteError(f"token file {p}: over 4096 bytes; a token is one line")
        token = p.read_text().strip()
    except OSError as e:
        raise RemoteError(f"token file {p}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise RemoteError(f"token file {p}: not UTF-8 text") from None
    if not token:
        raise RemoteError(f"token file {p} is empty")
    if os.name == "posix" and p.stat().st_mode & 0o077:
        log.warning("token file %s is readable by other users (chmod 600 it)", p)
    return token


def resolve_token(token: str | None = None, token_file: str | None = None) -> str | None:
    """The token: given, else ACCEL_TOKEN, else the file given, else ACCEL_TOKEN_FILE; None if none."""
    if token:
        return token
    if os.environ.get("ACCEL_TOKEN"):
        return os.environ["ACCEL_TOKEN"].strip()
    path = token_file or os.environ.get("ACCEL_TOKEN_FILE")
    return read_token_file(path) if path else None


def auth_proof(token: str, nonce: bytes) -> str:
    return hmac.new(token.encode(), AUTH_CONTEXT + nonce, hashlib.sha256).hexdigest()


# ---- the client driver -----------------------------------------------------------------------------
class RemoteDriver(Driver):
    """Runs programs on the device an `accel serve` exposes. cfg None takes the server's config;
    otherwise the server's config digest must equal cfg's (checked here, in software, on the full
    digest). Options: token / token_file (else ACCEL_TOKEN / ACCEL_TOKEN_FILE), timeout_s (one
    request, queueing on a busy server included), connect_timeout_s."""
    name = "remote"
    keeps_buffers = False   # other clients' programs may run on the server's device between ours

    def __init__(self, cfg: AccelConfig | None, url: str, token: str | None = None, token_file: str | None = None,
                 timeout_s: float = 900.0, connect_timeout_s: float = 10.0):
        self.url = url
        self.host, self.port = parse_url(url)
        self.timeout_s = float(timeout_s)
        token = resolve_token(token, token_file)
        try:
            self.sock = socket.create_connection((self.host, self.port), timeout=connect_timeout_s)
        except OSError as e:
            raise RemoteError(f"{url}: cannot connect: {e.strerror or e}") from None
        try:
            hello, _ = self._recv()
            if hello.get("type") != "hello" or hello.get("version") != PROTOCOL_VERSION:
                raise RemoteError(f"{url}: not an accel server of protocol version {PROTOCOL_VERSION} ({hello})")
            nonce = bytes.fromhex(str(hello.get("nonce", "")))
            if hello.get("auth") and not token:
                raise RemoteError(f"{url}: the server wants a token: set ACCEL_TOKEN or give --token-file")
            send_frame(self.sock, {"type": "auth", "proof": auth_proof(token, nonce) if token else ""})
            ok, _ = self._recv()
            if ok.get("type") != "welcome":
                raise RemoteError(f"{url}: {ok.get('message', 'authentication refused')}")
            server_cfg = AccelConfig.from_dict(hello["config"])
            if cfg is not None and cfg.digest() != server_cfg.digest():
                raise RemoteError(f"{url}: the server's device has config digest {server_cfg.digest()[:12]}, this "
                                  f"program was built for {cfg.digest()[:12]}; start the server with that config")
            self.server_driver = str(hello.get("driver"))
            self._shadow = None       # the DRAM image the server holds for this connection (page-padded)
            self.max_payload = int(hello.get("max_payload", DEFAULT_MAX_PAYLOAD))
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.sock.close()
            raise RemoteError(f"{url}: handshake failed: {e}") from None
        except BaseException:
            self.sock.close()
            raise
        super().__init__(server_cfg)

    def _recv(self, max_payload: int = 0) -> tuple[dict, bytearray]:
        try:
            header, payload = recv_frame(self.sock, max_payload=max_payload)
        except EOFError:
            raise RemoteError(f"{self.url}: the server closed the connection") from None
        except socket.timeout:
            raise RemoteError(f"{self.url}: no answer within {self.sock.gettimeout()} s") from None
        if header.get("type") == "error":
            raise RemoteError(f"{self.url}: {header.get('message')}")
        return header, payload

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> RunResult:
        if self.sock is None:
            raise RemoteError(f"{self.url}: the driver is closed")
        if dram.dtype != np.uint8 or dram.ndim != 1 or not dram.flags.c_contiguous:
            raise RemoteError(f"DRAM must be a contiguous 1-D uint8 array, got {dram.dtype} {dram.shape}")
        if dram.size > self.max_payload:
            raise RemoteError(f"{self.url}: a {dram.size}-byte DRAM image exceeds the server's limit of "
                              f"{self.max_payload} bytes (accel serve --max-bytes)")
        t0 = time.perf_counter()
        self.sock.settimeout(self.timeout_s)
        size = padded(dram.size)
        image = np.zeros(size, np.uint8)
        image[:dram.size] = dram
        head = {"type": "run", "digest": self.cfg.digest(), "insn_addr": int(insn_addr),
                "insn_count": int(insn_count), "dram_bytes": int(dram.size)}
        if self._shadow is not None and self._shadow.size == size:
            head["encoding"] = "pages"      # only what changed since the server last had it
            body = pack_pages(image, changed_pages(image, self._shadow))
        else:
            head["encoding"] = "full"
            body = dram
        self._shadow = None                 # unknown until the answer arrives
        try:
            send_frame(self.sock, head, body)
            header, payload = self._recv(4 + (size // PAGE) * (4 + PAGE))   # at most every page back
        except OSError as e:
            self.close()
            raise RemoteError(f"{self.url}: connection lost: {e}") from None
        if header.get("type") != "result":
            raise RemoteError(f"{self.url}: unexpected answer {header.get('type')!r}")
        idx, data = unpack_pages(payload, size // PAGE)
        image.reshape(-1, PAGE)[idx] = data
        dram[:] = image[:dram.size]
        self._shadow = image
        r = header.get("result") or {}
        stats = r.get("stats") or {}
        return RunResult(driver=f"{PREFIX}{self.host}:{self.port}/{r.get('driver', self.server_driver)}",
                         insn_count=int(r.get("insn_count", insn_count)), wall_s=time.perf_counter() - t0,
                         stats=stats, cycles=r.get("cycles"), raw=_timing_run(stats))

    def ping(self) -> float:
        """Round-trip seconds of a ping (also checks the connection)."""
        t0 = time.perf_counter()
        send_frame(self.sock, {"type": "ping"})
        self._recv()
        return time.perf_counter() - t0

    def close(self) -> None:
        if getattr(self, "sock", None) is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


def _timing_run(stats: dict):
    """sim.trace.TimingRun (counters, no timeline) rebuilt from a timing driver's stats, else None."""
    if not isinstance(stats, dict) or stats.get("schema") != SCHEMA:
        return None
    try:
        c = Counters(cycles=int(stats["cycles"]), clock_mhz=float(stats["clock_mhz"]),
                     macs_per_cycle=int(stats["macs_per_cycle"]),
                     stages={k: StageCounters(**{f: int(v) for f, v in d.items()}) for k, d in stats["stages"].items()},
                     gemm_uops=int(stats["gemm_uops"]), alu_uops=int(stats["alu_uops"]), macs=int(stats["macs"]),
                     bytes_read=int(stats["dram_bytes"]["read"]), bytes_written=int(stats["dram_bytes"]["written"]),
                     insns={str(k): int(v) for k, v in stats.get("insns", {}).items()})
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return TimingRun(c, None)
