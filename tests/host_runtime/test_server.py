"""`accel serve` (host_runtime/server.py) and the remote:// client on loopback: good and wrong
tokens, oversized and malformed frames, random bytes, a client dropping mid-request, concurrent
clients; after every hostile client the server still serves a good one. Every socket has a timeout."""
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

import compiler
from accel.isa import PRESETS, Finish, encode_program
from compiler.accel.conv2d import Requant, run_dense
from compiler.frontend import zoo
from host_runtime import Device, get_driver
from host_runtime.executor import Executor
from host_runtime.remote import FRAME, MAGIC, ProtocolError, RemoteError, auth_proof, parse_url, recv_frame, send_frame
from host_runtime.server import DeviceServer, ServerError

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from randprog import random_program  # noqa: E402

TINY = PRESETS["tiny"]
TOKEN = "t0k3n-" + "a" * 26


@pytest.fixture
def server(monkeypatch):
    monkeypatch.delenv("ACCEL_TOKEN", raising=False)
    monkeypatch.delenv("ACCEL_TOKEN_FILE", raising=False)
    srv = DeviceServer(TINY, driver="fsim", port=0, token=TOKEN, max_payload=1 << 20, request_timeout_s=2,
                       idle_timeout_s=10, max_clients=4).start()
    srv.url = f"remote://127.0.0.1:{srv.address[1]}"
    yield srv
    srv.close()


def _check_alive(srv, seed=1):
    """A good client still gets fsim's exact DRAM bytes."""
    prog, _ = random_program(TINY, seed)
    want, got = prog.dram_image(), prog.dram_image()
    get_driver("fsim", TINY).run(want, prog.insn_addr, len(prog.insns))
    with closing(get_driver(srv.url, TINY, token=TOKEN, timeout_s=30)) as d:
        res = d.run(got, prog.insn_addr, len(prog.insns))
    assert np.array_equal(got, want)
    return res


def _raw(srv, auth=True) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=10)
    hello, _ = recv_frame(s)
    assert hello["type"] == "hello" and hello["auth"] is True
    if auth:
        send_frame(s, {"type": "auth", "proof": auth_proof(TOKEN, bytes.fromhex(hello["nonce"]))})
        assert recv_frame(s)[0]["type"] == "welcome"
    return s


def _send(s: socket.socket, data: bytes) -> None:
    """Send what a hostile client sends; the server may close before it has all of it."""
    try:
        s.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _closed(s: socket.socket) -> bool:
    """True when the server closed the connection (after maybe one error frame)."""
    try:
        while True:
            h, _ = recv_frame(s)
            assert h["type"] == "error"
    except (EOFError, ConnectionResetError, ProtocolError):
        return True


def test_good_token_runs_like_local_fsim_with_stats(server):
    res = _check_alive(server)
    prog, _ = random_program(TINY, 1)
    local = get_driver("fsim", TINY).run(prog.dram_image(), prog.insn_addr, len(prog.insns))
    assert res.stats == json.loads(json.dumps(local.stats, default=str))
    assert res.driver.endswith("/fsim") and res.insn_count == len(prog.insns)


def test_token_from_environment_and_file(server, monkeypatch, tmp_path):
    monkeypatch.setenv("ACCEL_TOKEN", TOKEN)
    with closing(Device(server.url)) as dev:       # config comes from the server
        assert dev.cfg == TINY
    monkeypatch.delenv("ACCEL_TOKEN")
    f = tmp_path / "tok"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    with closing(get_driver(server.url, TINY, token_file=str(f))) as d:
        assert d.ping() < 5


def test_wrong_or_missing_token_is_refused(server):
    with pytest.raises(RemoteError, match="authentication failed"):
        get_driver(server.url, TINY, token="wrong-token-wrong-token")
    with pytest.raises(RemoteError, match="wants a token"):
        get_driver(server.url, TINY)
    # a forged proof on a raw socket: refused, closed
    s = _raw(server, auth=False)
    send_frame(s, {"type": "auth", "proof": "00" * 32})
    assert _closed(s)
    # a run before authenticating is not read
    s = _raw(server, auth=False)
    head = json.dumps({"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": 1}).encode()
    _send(s, FRAME.pack(MAGIC, len(head), 64) + head + bytes(64))
    assert _closed(s)
    _check_alive(server)


def test_other_config_is_refused_by_the_client():
    with DeviceServer("default", driver="fsim", port=0).start() as srv:
        with pytest.raises(RemoteError, match="config digest"):
            get_driver(f"remote://127.0.0.1:{srv.address[1]}", TINY)


def test_oversized_messages_are_refused_before_reading(server):
    s = _raw(server)
    _send(s, FRAME.pack(MAGIC, 10, (1 << 20) + 1))      # payload over max_payload
    assert _closed(s)
    s = _raw(server)
    _send(s, FRAME.pack(MAGIC, 1 << 30, 0))               # header over its limit
    assert _closed(s)
    s = _raw(server, auth=False)
    _send(s, FRAME.pack(MAGIC, 100, 1 << 16))            # any payload before authentication
    assert _closed(s)
    prog, _ = random_program(TINY, 1)
    with closing(get_driver(server.url, TINY, token=TOKEN)) as d:
        with pytest.raises(RemoteError, match="exceeds the server's limit"):
            d.run(np.zeros(2 << 20, np.uint8), 0, 1)
    _check_alive(server)


def test_random_bytes_and_malformed_frames_leave_it_running(server):
    rng = np.random.default_rng(0)
    for i in range(4):
        s = socket.create_connection(("127.0.0.1", server.address[1]), timeout=10)
        recv_frame(s)
        _send(s, rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())
        assert _closed(s)
    for header in (b"\xff\xfe not json", b"[1, 2]", b'{"type": 7}', b'{"a": ' * 5000 + b"1" + b"}" * 5000):
        s = _raw(server)
        _send(s, FRAME.pack(MAGIC, len(header), 0) + header)
        assert _closed(s)
    # well-framed but bad requests get an error and keep the connection
    s = _raw(server)
    for req in ({"type": "run", "digest": TINY.digest(), "insn_addr": -16, "insn_count": 1},
                {"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": "1"},
                {"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": 10 ** 30},
                {"type": "run", "digest": "0" * 64, "insn_addr": 0, "insn_count": 1},
                {"type": "exec", "code": "import os"}):
        send_frame(s, req, bytes(256))
        h, _ = recv_frame(s)
        assert h["type"] == "error", req
    for req, body in (({"encoding": "pages"}, struct.pack("<I", 0)),          # no image kept yet
                      ({"encoding": "full"}, bytes(100)),                     # size mismatch
                      ({"encoding": "zip"}, bytes(256))):
        send_frame(s, {"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": 4, "dram_bytes": 256,
                       **req}, body)
        h, _ = recv_frame(s)
        assert h["type"] == "error", req
    send_frame(s, {"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": 4, "dram_bytes": 256,
                   "encoding": "full"}, bytes(256))
    h, _ = recv_frame(s)                  # four zero words: a failing program, reported, not fatal
    assert h["type"] in ("error", "result")
    send_frame(s, {"type": "ping"})
    assert recv_frame(s)[0]["type"] == "pong"
    s.close()
    _check_alive(server)


def test_client_disconnecting_mid_request(server):
    for cut in (3, FRAME.size + 5, 5000):
        s = _raw(server)
        head = json.dumps({"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": 1}).encode()
        frame = FRAME.pack(MAGIC, len(head), 1 << 16) + head + bytes(1 << 16)
        _send(s, frame[:cut])
        s.close()
    # a client that stalls mid-frame is cut after request_timeout_s (2 s)
    s = _raw(server)
    s.sendall(FRAME.pack(MAGIC, 10, 0)[:5])
    t0 = time.monotonic()
    assert _closed(s) and time.monotonic() - t0 < 8
    _check_alive(server)


def test_two_concurrent_clients_queue(server):
    """Two clients at once, each running compiled dense layers on its own remote Device: runs queue
    on the one device and each client gets exactly its local fsim result back. (Compiled layers
    load everything they read; random programs may read on-chip entries left by another run.)"""
    errors, done = [], []

    def layer(seed):
        rng = np.random.default_rng(seed)
        return rng.integers(-128, 128, (6, 40), dtype=np.int8), rng.integers(-128, 128, (24, 40), dtype=np.int8)

    def client(k):
        try:
            with Device(TINY, driver=server.url, dram_bytes=1 << 20, token=TOKEN, timeout_s=60) as dev:
                for i in range(3):
                    x, w = layer(10 * k + i)
                    y, res, _ = run_dense(dev, x, w, None, Requant(6))
                    with Device(TINY, driver="fsim", dram_bytes=1 << 20) as local:
                        want, _, _ = run_dense(local, x, w, None, Requant(6))
                    assert np.array_equal(y, want), f"client {k} layer {i}"
                    assert res.stats["gemm_uops"] > 0
                    done.append(k)
        except Exception as e:   # reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads) and sorted(done) == [0, 0, 0, 1, 1, 1]


def test_too_many_clients_get_an_error():
    with DeviceServer(TINY, driver="fsim", port=0, max_clients=1).start() as srv:
        a = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=10)
        assert recv_frame(a)[0]["type"] == "hello"
        b = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=10)
        h, _ = recv_frame(b)
        assert h["type"] == "error" and "too many" in h["message"]
        a.close()


def test_bind_rules_and_limits():
    with pytest.raises(ServerError, match="refusing to listen on 0.0.0.0 without a token"):
        DeviceServer(TINY, host="0.0.0.0", port=0)
    with pytest.raises(ServerError, match="shorter than 16"):
        DeviceServer(TINY, port=0, token="short")
    for bad in (0, -1, 5 << 30, 1.5):
        with pytest.raises(ServerError, match="max_payload"):
            DeviceServer(TINY, port=0, max_payload=bad)
    with pytest.raises(ServerError, match="a server exposes one of"):
        DeviceServer(TINY, driver="remote://x:1", port=0)
    for url in ("remote://", "remote://h:0", "remote://h:70000", "remote://a b:1", "http://h:1"):
        with pytest.raises(RemoteError, match="remote://HOST:PORT|outside"):
            parse_url(url)
    assert parse_url("remote://[::1]:9") == ("::1", 9)


def test_cli_serve_and_run_remote(tmp_path):
    """accel serve in a process, accel run PROG.accp --driver remote://... --token-file F: the same
    DRAM as a local run."""
    prog, _ = random_program(TINY, 2)
    path = tmp_path / "p.accp"
    prog.save(path)
    tok = tmp_path / "tok"
    tok.write_text(TOKEN)
    tok.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in ("ACCEL_TOKEN", "ACCEL_TOKEN_FILE")}
    srv = subprocess.Popen([sys.executable, "-m", "accel.cli", "serve", "--config", "tiny", "--port", "0",
                            "--token-file", str(tok)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env)
    try:
        line = srv.stdout.readline()
        url = line.split("--driver ")[1].split(")")[0]
        outs = {}
        for drv, extra in (("fsim", []), (url, ["--token-file", str(tok)])):
            out = tmp_path / f"{len(outs)}.bin"
            p = subprocess.run([sys.executable, "-m", "accel.cli", "run", str(path), "--driver", drv,
                                "--dump-dram", str(out), *extra], capture_output=True, text=True, timeout=120, env=env)
            assert p.returncode == 0, p.stderr
            outs[drv] = out.read_bytes()
        assert outs["fsim"] == outs[url]
        p = subprocess.run([sys.executable, "-m", "accel.cli", "run", str(path), "--driver", url],
                           capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 2 and "wants a token" in p.stderr
    finally:
        srv.terminate()
        _, err = srv.communicate(timeout=30)
    assert "authenticated" in err and "run " in err     # one log line per request


def test_compiled_model_through_the_executor(server, monkeypatch):
    """Executor(mod, driver="remote://...") (what `accel run M.accm --driver remote://` does): the
    outputs equal a local run, CPU steps run here, accelerator steps report the server's driver."""
    m = zoo.residual_block()
    feeds = zoo.sample_inputs(m, 3, seed=4)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2])
    with Executor(mod, driver="fsim") as ex:
        want = ex.run(feeds[2])
    monkeypatch.setenv("ACCEL_TOKEN", TOKEN)
    with Executor(mod, driver=server.url) as ex:
        got = ex.run(feeds[2])
        rows = [r for r in ex.profile if r["target"] == "accel"]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"output {k}")
    assert rows and all(r["driver"].endswith("/fsim") and r["gemm_uops"] > 0 for r in rows)


def test_later_runs_send_only_changed_pages(server, caplog):
    """A connection's second run sends the pages that changed since the server's copy, and gets back
    the pages the run changed; after inputs change between runs the DRAM still equals local fsim's.
    A forged page blob is refused."""
    caplog.set_level(logging.INFO, logger="host_runtime.server")
    rng = np.random.default_rng(5)
    with Device(TINY, driver=server.url, dram_bytes=1 << 20, token=TOKEN) as dev, \
            Device(TINY, driver="fsim", dram_bytes=1 << 20) as local:
        for i in range(3):
            x = rng.integers(-128, 128, (6, 40), dtype=np.int8)
            w = rng.integers(-128, 128, (24, 40), dtype=np.int8)
            y, _, _ = run_dense(dev, x, w, None, Requant(6))
            want, _, _ = run_dense(local, x, w, None, Requant(6))
            assert np.array_equal(y, want)
            assert np.array_equal(dev.memory.array, local.memory.array)
    runs = [r.getMessage() for r in caplog.records if " run " in r.getMessage()]
    assert "(full, 1048576 bytes in)" in runs[0] and all("(pages, " in m for m in runs[1:])
    assert all(int(m.split("(pages, ")[1].split(" ")[0]) < 200_000 for m in runs[1:])
    s = _raw(server)
    image = np.zeros(8192, np.uint8)
    image[:16] = encode_program([Finish()], TINY).reshape(-1)
    send_frame(s, {"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": 1, "dram_bytes": 8192,
                   "encoding": "full"}, image)
    assert recv_frame(s)[0]["type"] == "result"           # the server now keeps this image
    for blob in (struct.pack("<I", 1) + struct.pack("<I", 9) + bytes(4096),          # index past the image
                 struct.pack("<I", 2) + struct.pack("<II", 1, 0) + bytes(8192),      # not increasing
                 struct.pack("<I", 3) + bytes(20)):                                  # short
        send_frame(s, {"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": 1, "dram_bytes": 8192,
                       "encoding": "pages"}, blob)
        h, _ = recv_frame(s)
        assert h["type"] == "error" and "page" in h["message"] and "needs the image" not in h["message"], h
    send_frame(s, {"type": "run", "digest": TINY.digest(), "insn_addr": 0, "insn_count": 1, "dram_bytes": 8192,
                   "encoding": "pages"}, struct.pack("<I", 0))
    assert recv_frame(s)[0]["type"] == "result"           # refused blobs left the kept image alone
    s.close()


def test_a_trickling_client_is_cut_at_the_frame_deadline(server):
    """Bytes arriving just inside the per-read timeout do not keep a frame open: the whole frame
    has request_timeout_s (2 s here), before and after authenticating."""
    for auth in (False, True):
        s = _raw(server, auth=auth)
        head = json.dumps({"type": "ping", "pad": "x" * 100}).encode()
        frame = FRAME.pack(MAGIC, len(head), 0) + head
        t0, cut = time.monotonic(), False
        for b in frame:
            try:
                s.sendall(bytes([b]))
            except OSError:
                cut = True
                break
            if time.monotonic() - t0 > 8:
                break
            time.sleep(0.5)
        assert cut or _closed(s)
        assert time.monotonic() - t0 < 8
        s.close()
    _check_alive(server)


def test_counters_and_cycles_come_back_from_a_timing_driver(monkeypatch):
    """A tsim server: the remote run's cycles and counters equal a local tsim run's."""
    monkeypatch.setenv("ACCEL_TSIM_HELPER", "0")
    prog, _ = random_program(TINY, 4)
    local = get_driver("tsim", TINY)
    want = local.run(prog.dram_image(), prog.insn_addr, len(prog.insns))
    local.close()
    with DeviceServer(TINY, driver="tsim", port=0).start() as srv:
        with closing(get_driver(f"remote://127.0.0.1:{srv.address[1]}", TINY)) as d:
            got = d.run(prog.dram_image(), prog.insn_addr, len(prog.insns))
    assert got.cycles == want.cycles > 0
    assert got.stats == json.loads(json.dumps(want.stats, default=str))
    assert got.raw.counters.to_dict() == json.loads(json.dumps(want.raw.counters.to_dict()))   # accel run --counters
