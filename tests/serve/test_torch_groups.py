"""Weight-update groups formed by Python torch on the other side, as SGLang,
verl and slime form them, against ours in both roles:

- our trainer-side client (rank 0, hosting the store) syncs into a server
  written as SGLang's (Python, rank 1: torch.distributed's tcp:// rendezvous,
  PrefixStore(group_name), _new_process_group_helper);
- a Python sender written as slime's (rank 0, hosting the store) updates
  `rlhost serve` (rank 1), which then generates what a server started on the
  sent weights generates.

Gloo on the CPU, per tensor and `flattened_bucket`, float32 and bfloat16 on
the wire. Run with the Python whose torch the build uses (the project venv);
exits 77 (skipped) when that torch is missing or another version."""

import json
import os
import struct
import sys
import threading
import unittest
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import build_torch

torch = build_torch.require()
import torch.distributed as dist  # noqa: E402
from torch.distributed.distributed_c10d import (Backend, PrefixStore,  # noqa: E402
                                                _new_process_group_helper, _world,
                                                rendezvous)

import rl  # noqa: E402  (after the skip checks)
from test_sync import PROMPT, ServerProcess, greedy  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from free_port import free_port  # noqa: E402

TIMEOUT = timedelta(seconds=120)



def join_group(backend, master_address, master_port, rank, world_size, group_name):
    """A process group formed the way SGLang's init_custom_process_group forms
    it (and so verl's and slime's senders): the tcp:// rendezvous store, a
    PrefixStore named after the group, then torch's own group helper."""
    store, rank, world_size = next(rendezvous(f"tcp://{master_address}:{master_port}", rank,
                                              world_size, timeout=TIMEOUT))
    store.set_timeout(TIMEOUT)
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store,
                                      group_name=group_name, timeout=TIMEOUT)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    """name -> tensor of a .safetensors file (the format's header + raw bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        raw = bytearray(data[8 + n + lo:8 + n + hi])
        t = torch.frombuffer(raw, dtype=torch.uint8).view(DTYPES[meta["dtype"]])
        out[name] = t.reshape(meta["shape"]).clone()
    return out


def weights_of(model_dir):
    out = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            out.update(read_safetensors(os.path.join(model_dir, f)))
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


class SglangLikeServer:
    """The weight routes of an SGLang server, in Python: joins the group as
    rank_offset and receives the broadcasts into new tensors."""

    def __init__(self):
        self.group = None
        self.version = None
        self.received = {}
        self.calls = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, obj):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                outer.calls.append(self.path)
                if self.path == "/get_model_info":
                    self.reply({"model_path": "test", "weight_version": outer.version})
                else:
                    self.reply({"tp_size": 1, "version": "0.5.x (test)"})

            def do_POST(self):
                outer.calls.append(self.path)
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n) or b"{}")
                try:
                    self.reply(outer.handle(self.path, req))
                except Exception as e:  # the client reports the message
                    self.reply({"success": False, "message": f"{type(e).__name__}: {e}"})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def handle(self, path, req):
        if path == "/init_weights_update_group":
            self.group = join_group(req["backend"], req["master_address"], req["master_port"],
                                    req["rank_offset"], req["world_size"], req["group_name"])
            return {"success": True, "message": "joined"}
        if path == "/update_weights_from_distributed":
            names, shapes = req["names"], req["shapes"]
            dtypes = [getattr(torch, d) for d in req["dtypes"]]
            if req.get("load_format") == "flattened_bucket":
                sizes = [torch.Size(s).numel() * torch.empty((), dtype=d).element_size()
                         for s, d in zip(shapes, dtypes)]
                buf = torch.empty(sum(sizes), dtype=torch.uint8)
                dist.broadcast(buf, src=0, group=self.group)
                at = 0
                for name, shape, dtype, size in zip(names, shapes, dtypes, sizes):
                    self.received[name] = buf[at:at + size].view(dtype).reshape(shape).clone()
                    at += size
            else:
                for name, shape, dtype in zip(names, shapes, dtypes):
                    t = torch.empty(shape, dtype=dtype)
                    dist.broadcast(t, src=0, group=self.group)
                    self.received[name] = t
            if req.get("weight_version") is not None:
                self.version = req["weight_version"]
            return {"success": True, "message": "Succeeded to update parameter online."}
        if path == "/destroy_weights_update_group":
            if self.group is not None:
                dist.destroy_process_group(self.group)
                self.group = None
            return {"success": True, "message": "destroyed"}
        if path in ("/pause_generation", "/continue_generation"):
            return {"success": True, "message": ""}
        return {"success": False, "message": f"no route {path}"}

    def close(self):
        self.http.shutdown()
        self.http.server_close()


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=180) as r:
        return json.loads(r.read() or b"null")


class Groups(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.tmp = tempfile.mkdtemp(prefix="rl-torch-groups-")
        cls.a = os.path.join(cls.tmp, "a")
        cls.b = os.path.join(cls.tmp, "b")
        rl.init_model("tiny", cls.a, 7)
        rl.init_model("tiny", cls.b, 8)
        cls.weights_b = weights_of(cls.b)
        with rl.Model(cls.b) as m:
            cls.want_b = greedy(m)

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # -- our trainer-side client (rank 0) -> a Python receiver (rank 1) --------

    def sync_into_python(self, options):
        server = SglangLikeServer()
        try:
            client = rl.InferenceClient(server.url)
            try:
                with rl.Model(self.b) as m:
                    client.sync(m, 1, dict({"mode": "distributed", "master_address": "127.0.0.1",
                                            "backend": "gloo", "group_name": "weights"},
                                           **options))
            finally:
                client.close()
        finally:
            server.close()
        self.assertIn("/init_weights_update_group", server.calls)
        self.assertIn("/destroy_weights_update_group", server.calls)
        return server.received

    def test_our_sender_reaches_a_python_receiver_bit_for_bit_per_tensor(self):
        got = self.sync_into_python({})
        self.assertEqual(sorted(got), sorted(self.weights_b))
        for name, want in self.weights_b.items():
            self.assertTrue(same_bits(got[name], want), name)

    def test_our_sender_reaches_a_python_receiver_as_flattened_buckets_in_bfloat16(self):
        got = self.sync_into_python({"flattened": True, "dtype": "bfloat16",
                                     "bucket_bytes": 1 << 20})
        self.assertEqual(sorted(got), sorted(self.weights_b))
        for name, want in self.weights_b.items():
            self.assertTrue(same_bits(got[name], want.to(torch.bfloat16)), name)

    # -- a Python sender (rank 0) -> rlhost serve (rank 1) ---------------------

    def send_from_python(self, flattened):
        server = ServerProcess(self.a, os.path.join(self.tmp, f"{self._testMethodName}.log"))
        try:
            port = free_port()
            body = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
                    "world_size": 2, "group_name": "slime", "backend": "gloo"}
            replies = {}
            # As slime does: ask the server to join, and form the group meanwhile.
            t = threading.Thread(target=lambda: replies.update(
                init=post(server.url, "/init_weights_update_group", body)))
            t.start()
            pg = join_group("gloo", "127.0.0.1", port, 0, 2, "slime")
            t.join()
            self.assertTrue(replies["init"]["success"], replies["init"])
            names = sorted(self.weights_b)
            tensors = [self.weights_b[n].contiguous() for n in names]
            update = {"names": names, "dtypes": [str(x.dtype).replace("torch.", "") for x in tensors],
                      "shapes": [list(x.shape) for x in tensors], "group_name": "slime",
                      "flush_cache": True, "weight_version": "1"}
            if flattened:
                update["load_format"] = "flattened_bucket"
            t = threading.Thread(target=lambda: replies.update(
                update=post(server.url, "/update_weights_from_distributed", update)))
            t.start()
            if flattened:
                buf = torch.cat([x.view(-1).view(torch.uint8) for x in tensors])
                dist.broadcast(buf, src=0, group=pg)
            else:
                for x in tensors:
                    dist.broadcast(x, src=0, group=pg)
            t.join()
            self.assertTrue(replies["update"]["success"], replies["update"])
            done = post(server.url, "/destroy_weights_update_group", {"group_name": "slime"})
            self.assertTrue(done["success"], done)
            dist.destroy_process_group(pg)
            served = post(server.url, "/generate", {
                "input_ids": PROMPT,
                "sampling_params": {"temperature": 0, "max_new_tokens": 12, "stop_token_ids": []}})
            return served["output_ids"]
        finally:
            self.assertEqual(server.stop(), 0, "rlhost serve exits 0 on SIGTERM")

    def test_a_python_sender_updates_rlhost_serve_per_tensor(self):
        self.assertEqual(self.send_from_python(False), self.want_b)

    def test_a_python_sender_updates_rlhost_serve_with_a_flattened_bucket(self):
        self.assertEqual(self.send_from_python(True), self.want_b)


if __name__ == "__main__":
    unittest.main()
