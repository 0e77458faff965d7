"""vLLM's NCCL weight transfer (vLLM 0.33.0) against Python code that does
what vLLM's side does, without vLLM installed:

- Rendezvous: the StatelessProcessGroup's store (Python torch's TCPStore as
  vLLM's StatelessProcessGroup.create opens it) and broadcast_obj of the NCCL
  unique id (pickle of a ctypes ncclUniqueId defined under vLLM's module path,
  vllm_fake/), against our C++ side (the vllm_peer program), in both roles;
  malformed pickles are refused naming the store key. Runs on the CPU.
- Routes: `rlhost serve` (CPU) answers what a vLLM trainer reads before a
  transfer (/get_world_size, /weight_info) in vLLM's shapes, takes the
  init_info a torch-free trainer posts (nccl_unique_id_b64 as Python's
  base64.b64encode writes it; URL-safe base64 refused, as vLLM does) up to
  the CUDA check, and vLLM's per-worker update_info lists. Runs on the CPU.
- Nccl (ctest label `cuda`): the transfer itself, on two CUDA devices (NCCL
  refuses two ranks on one). A trainer written as vLLM's (ctypes NCCL, as
  vLLM's pynccl_wrapper) on cuda:0 updates `rlhost serve --device cuda:1`
  through /init_weight_transfer_engine, /start_weight_update,
  /update_weights and /finish_weight_update, per tensor, packed, and with the
  id in the request (nccl_unique_id_b64, no store); the server then
  generates what a server started on the sent weights does. Our trainer-side
  client (protocol vllm, mode distributed, both rendezvous) syncs into a
  worker written as vLLM's (cuda:1, in this process), bit for bit. Exits 77
  (skipped) with fewer than two CUDA devices.

Run with the Python whose torch the build uses; `python test_vllm_transfer.py
Nccl` runs the NCCL tests only, `Rendezvous Routes` the others."""

import base64
import ctypes
import json
import os
import pickle
import secrets
import socket
import subprocess
import sys
import threading
import unittest
import urllib.error
import urllib.request
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vllm_fake"))

import build_torch  # noqa: E402

torch = build_torch.require()
from torch.distributed import TCPStore  # noqa: E402

from vllm.distributed.device_communicators.pynccl_wrapper import ncclUniqueId  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from free_port import free_port  # noqa: E402

PEER = os.environ.get("RL_TEST_VLLM_PEER", "")
TIMEOUT = timedelta(seconds=60)
HOST = "127.0.0.1"
KEY = "broadcast_from/0/0"



def vllm_store(port, rank, world_size):
    """The store of vLLM's StatelessProcessGroup.create: rank 0 binds the port
    itself and hands the socket to a master TCPStore; every member counts
    itself (wait_for_workers, the default) and the master waits for all."""
    if rank == 0:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((HOST, port))
        s.listen()
        return TCPStore(host_name=HOST, port=port, world_size=world_size, is_master=True,
                        timeout=TIMEOUT, use_libuv=False, master_listen_fd=s.detach())
    return TCPStore(host_name=HOST, port=port, world_size=world_size, is_master=False,
                    timeout=TIMEOUT, use_libuv=False)


class VllmGroup:
    """broadcast_obj of vLLM's StatelessProcessGroup: per-source counters,
    pickle.dumps into "broadcast_from/<src>/<n>", pickle.loads out of it."""

    def __init__(self, store, rank):
        self.store, self.rank, self.sent, self.received = store, rank, 0, 0

    def broadcast_obj(self, obj, src):
        if self.rank == src:
            self.store.set(f"broadcast_from/{src}/{self.sent}", pickle.dumps(obj))
            self.sent += 1
            return obj
        obj = pickle.loads(self.store.get(f"broadcast_from/{src}/{self.received}"))
        self.received += 1
        return obj


def make_id(raw):
    u = ncclUniqueId()
    ctypes.memmove(ctypes.addressof(u), raw, 128)
    return u


def start_peer(*args):
    return subprocess.Popen([PEER, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(peer):
    out, err = peer.communicate(timeout=90)
    return peer.returncode, out, err


@unittest.skipUnless(PEER, "RL_TEST_VLLM_PEER (the vllm_peer program) is not set")
class Rendezvous(unittest.TestCase):
    def test_our_worker_reads_the_ids_a_vllm_trainer_broadcasts_in_order(self):
        port = free_port()
        ids = [secrets.token_bytes(128) for _ in range(2)]
        peer = start_peer("worker", HOST, port, 1, 2, 2)
        store = vllm_store(port, 0, 2)  # returns once the peer counted itself
        group = VllmGroup(store, 0)
        for raw in ids:
            group.broadcast_obj(make_id(raw), src=0)
        rc, out, err = finish(peer)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), [raw.hex() for raw in ids])

    def test_a_vllm_worker_reads_the_ids_our_trainer_broadcasts_as_python_pickles_them(self):
        port = free_port()
        ids = [secrets.token_bytes(128) for _ in range(2)]
        peer = start_peer("trainer", HOST, port, 2, *[raw.hex() for raw in ids])
        try:
            store = vllm_store(port, 1, 2)
            group = VllmGroup(store, 1)
            for n, raw in enumerate(ids):
                got = group.broadcast_obj(None, src=0)
                self.assertIsInstance(got, ncclUniqueId)
                self.assertEqual(bytes(got), raw)
                # Byte for byte what Python's pickle writes for the same id.
                self.assertEqual(store.get(f"broadcast_from/0/{n}"), pickle.dumps(make_id(raw)))
            store.set("test/done", b"1")
        finally:
            rc, out, err = finish(peer)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.strip(), "published 2")

    def test_every_worker_of_a_larger_group_reads_the_id(self):
        port = free_port()
        raw = secrets.token_bytes(128)
        peers = [start_peer("worker", HOST, port, rank, 3, 1) for rank in (1, 2)]
        store = vllm_store(port, 0, 3)  # waits for both workers
        VllmGroup(store, 0).broadcast_obj(make_id(raw), src=0)
        for peer in peers:
            rc, out, err = finish(peer)
            self.assertEqual(rc, 0, err)
            self.assertEqual(out.split(), [raw.hex()])

    def test_our_worker_reads_protocol_5_as_python_3_14_writes_it(self):
        port = free_port()
        raw = secrets.token_bytes(128)
        peer = start_peer("worker", HOST, port, 1, 2, 1)
        store = vllm_store(port, 0, 2)
        store.set(KEY, pickle.dumps(make_id(raw), protocol=5))
        rc, out, err = finish(peer)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), [raw.hex()])

    def test_values_other_than_a_pickled_vllm_nccl_id_are_refused_naming_the_key(self):
        good = pickle.dumps(make_id(secrets.token_bytes(128)))
        cases = {
            "protocol 2": pickle.dumps(make_id(bytes(128)), protocol=2),
            "plain bytes": pickle.dumps(bytes(128)),
            "a tuple": pickle.dumps((bytes(128), 0)),
            "another class": good.replace(b"ncclUniqueId", b"ncclUniqueIx"),
            "another module": good.replace(b"pynccl_wrapper", b"pynccl_wrappex"),
            "another callable": good.replace(b"_unpickle", b"_unpickly"),
            "truncated": good[:-1],
            "trailing bytes": good + b".",
            "a call of os.system": b"cos\nsystem\n(S'echo pwned'\ntR.",
            "empty": b"",
        }
        for what, value in cases.items():
            with self.subTest(what):
                port = free_port()
                peer = start_peer("worker", HOST, port, 1, 2, 1)
                store = vllm_store(port, 0, 2)
                store.set(KEY, value)
                rc, out, err = finish(peer)
                self.assertEqual(rc, 1, out)
                self.assertIn(f"store key '{KEY}': not a pickled vLLM ncclUniqueId", err)
                self.assertEqual(out, "")


def get(url, path):
    try:
        with urllib.request.urlopen(url + path, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@unittest.skipUnless(os.environ.get("RL_TEST_RLHOST"), "RL_TEST_RLHOST is not set")
class Routes(unittest.TestCase):
    """What a vLLM 0.33 trainer sends and reads, against `rlhost serve` on the
    CPU (the transfer itself needs CUDA: Nccl below)."""

    @classmethod
    def setUpClass(cls):
        import tempfile

        import rl
        from test_sync import ServerProcess
        cls.tmp = tempfile.mkdtemp(prefix="rl-vllm-routes-")
        model = os.path.join(cls.tmp, "a")
        rl.init_model("tiny", model, 7)
        cls.server = ServerProcess(model, os.path.join(cls.tmp, "serve.log"))
        cls.url = cls.server.url

    @classmethod
    def tearDownClass(cls):
        import shutil
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_a_trainer_reads_the_world_size_and_weight_version_as_vllm_serves_them(self):
        for query in ("", "?include_dp=true", "?include_dp=false"):
            self.assertEqual(get(self.url, "/get_world_size" + query), (200, {"world_size": 1}))
        status, body = get(self.url, "/get_world_size?include_dp=perhaps")
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["param"], "include_dp")
        status, info = get(self.url, "/weight_info")
        self.assertEqual(status, 200, info)
        self.assertEqual(list(info), ["weight_version"])
        self.assertEqual(info["weight_version"],
                         get(self.url, "/get_model_info")[1]["weight_version"])

    def test_the_init_info_of_a_torch_free_trainer_is_taken_up_to_the_cuda_check(self):
        raw = bytes([0xfb, 0xff]) * 64  # "+/" in base64, "-_" in its URL-safe form
        # vLLM's worker_init_payload: the init info as a dict, unset fields dropped.
        info = {"master_address": None, "master_port": None, "rank_offset": 1, "world_size": 2,
                "nccl_unique_id_b64": base64.b64encode(raw).decode(), "packed": False,
                "packed_buffer_size_bytes": 1 << 30, "packed_num_buffers": 2}
        payload = {k: v for k, v in info.items() if v is not None}
        status, body = post(self.url, "/init_weight_transfer_engine", {"init_info": payload})
        self.assertEqual(status, 400, body)
        self.assertIn("needs the model on a CUDA device", body["error"]["message"])
        # vLLM decodes with b64decode(validate=True): the URL-safe alphabet is refused.
        payload["nccl_unique_id_b64"] = base64.urlsafe_b64encode(raw).decode()
        status, body = post(self.url, "/init_weight_transfer_engine", {"init_info": payload})
        self.assertEqual(status, 400, body)
        self.assertIn("nccl_unique_id_b64 must be standard base64", body["error"]["message"])

    def test_per_worker_update_info_lists_are_taken_when_every_entry_is_this_workers(self):
        entry = {"names": ["model.norm.weight"], "dtype_names": ["float32"], "shapes": [[64]]}
        # Matching entries pass; only the missing engine stops them.
        status, body = post(self.url, "/update_weights", {"update_info": [entry, entry]})
        self.assertEqual(status, 400, body)
        self.assertIn("call /init_weight_transfer_engine first", body["error"]["message"])
        shard = dict(entry, shapes=[[32]])  # rank 1's half of a tensor-parallel split
        status, body = post(self.url, "/update_weights", {"update_info": [entry, shard]})
        self.assertEqual(status, 400, body)
        self.assertIn("update_info[1] differs from update_info[0] (shapes[0] is [32], "
                      "update_info[0]'s [64])", body["error"]["message"])
        self.assertEqual(body["error"]["param"], "update_info")


# -- the NCCL transfer (a CUDA device) -------------------------------------------

NCCL_TYPES = {torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6,
              torch.float32: 7, torch.float64: 8, torch.bfloat16: 9}


class PyNccl:
    """What vLLM's pynccl_wrapper does: NCCL's C API through ctypes, on the
    libnccl.so.2 that torch loaded; the warm-up all_reduce after init."""

    def __init__(self, device):
        self.device = torch.device(device)
        lib = ctypes.CDLL("libnccl.so.2")
        p = ctypes.c_void_p
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetErrorString.argtypes = [ctypes.c_int]
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(ncclUniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(p), ctypes.c_int, ncclUniqueId,
                                         ctypes.c_int]
        lib.ncclAllReduce.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, p, p]
        lib.ncclBroadcast.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, p, p]
        lib.ncclCommDestroy.argtypes = [p]
        self.lib = lib

    def check(self, r, what):
        if r != 0:
            raise RuntimeError(f"{what}: {self.lib.ncclGetErrorString(r).decode()}")

    def unique_id(self):
        u = ncclUniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(u)), "ncclGetUniqueId")
        return u

    def stream(self):
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def init(self, world_size, uid, rank):
        with torch.cuda.device(self.device):
            comm = ctypes.c_void_p()
            self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), world_size, uid, rank),
                       "ncclCommInitRank")
            self.comm = comm
            warm = torch.zeros(1, device=self.device)
            self.check(self.lib.ncclAllReduce(warm.data_ptr(), warm.data_ptr(), 1, 7, 0, comm,
                                              self.stream()), "ncclAllReduce")
            torch.cuda.current_stream(self.device).synchronize()

    def broadcast(self, t, src=0):
        with torch.cuda.device(self.device):
            self.check(self.lib.ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(),
                                              NCCL_TYPES[t.dtype], src, self.comm,
                                              self.stream()), "ncclBroadcast")
            torch.cuda.current_stream(self.device).synchronize()

    def close(self):
        self.lib.ncclCommDestroy(self.comm)


def packed_chunks(sizes, buffer_bytes):
    """vLLM's packing: tensors go into a buffer until it holds more than
    buffer_bytes (the one that crosses it included)."""
    chunks, cur, total = [], [], 0
    for i, n in enumerate(sizes):
        cur.append(i)
        total += n
        if total > buffer_bytes:
            chunks.append(cur)
            cur, total = [], 0
    if cur:
        chunks.append(cur)
    return chunks


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class Nccl(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile

        import rl
        from test_sync import greedy
        from test_torch_groups import weights_of
        cls.rl = rl
        cls.tmp = tempfile.mkdtemp(prefix="rl-vllm-nccl-")
        cls.a = os.path.join(cls.tmp, "a")
        cls.b = os.path.join(cls.tmp, "b")
        rl.init_model("tiny", cls.a, 7)
        rl.init_model("tiny", cls.b, 8)
        cls.weights_b = weights_of(cls.b)
        with rl.Model(cls.b, {"device": "cuda:1"}) as m:  # the server's device
            cls.want_b = greedy(m)

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def send_from_python(self, packed, unique_id=False):
        """A trainer written as vLLM's NCCLTrainerWeightTransferEngine, or with
        `unique_id` as a torch-free trainer: no store, the id base64 in the
        request and both sides in ncclCommInitRank together."""
        import test_sync
        from test_sync import PROMPT
        rlhost = test_sync.RLHOST
        proc = subprocess.Popen([rlhost, "serve", "--model", self.a, "--port", "0",
                                 "--device", "cuda:1"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            url = None
            for line in proc.stdout:
                if "listening on " in line:
                    url = line.split("listening on ")[1].split()[0]
                    break
            self.assertIsNotNone(url, "rlhost serve did not start")
            port = free_port()
            buffer_bytes = 1 << 16
            init_info = {"master_address": HOST, "master_port": port, "rank_offset": 1,
                         "world_size": 2, "packed": packed,
                         "packed_buffer_size_bytes": buffer_bytes, "packed_num_buffers": 2}
            nccl = PyNccl("cuda:0")
            if unique_id:
                uid = nccl.unique_id()
                del init_info["master_address"], init_info["master_port"]
                init_info["nccl_unique_id_b64"] = base64.b64encode(bytes(uid)).decode()
            replies = {}
            t = threading.Thread(target=lambda: replies.update(
                init=post(url, "/init_weight_transfer_engine", {"init_info": init_info})))
            t.start()
            if not unique_id:
                store = vllm_store(port, 0, 2)
                uid = VllmGroup(store, 0).broadcast_obj(nccl.unique_id(), src=0)
            nccl.init(2, uid, 0)
            t.join()
            self.assertEqual(replies["init"][0], 200, replies["init"])
            self.assertEqual(post(url, "/start_weight_update", {})[0], 200)
            names = sorted(self.weights_b)
            tensors = [self.weights_b[n].contiguous().to("cuda:0") for n in names]
            info = {"names": names,
                    "dtype_names": [str(x.dtype).split(".")[-1] for x in tensors],
                    "shapes": [list(x.shape) for x in tensors]}
            t = threading.Thread(target=lambda: replies.update(
                update=post(url, "/update_weights", {"update_info": info})))
            t.start()
            if packed:
                sizes = [x.numel() * x.element_size() for x in tensors]
                chunks = packed_chunks(sizes, buffer_bytes)
                self.assertGreater(len(chunks), 1)
                for chunk in chunks:
                    nccl.broadcast(torch.cat([tensors[i].view(-1).view(torch.uint8)
                                              for i in chunk]))
            else:
                for x in tensors:
                    nccl.broadcast(x)
            t.join()
            self.assertEqual(replies["update"][0], 200, replies["update"])
            done = post(url, "/finish_weight_update", {"weight_version": "5"})
            self.assertEqual(done[0], 200, done)
            nccl.close()
            served = post(url, "/generate", {
                "input_ids": PROMPT,
                "sampling_params": {"temperature": 0, "max_new_tokens": 12, "stop_token_ids": []}})
            self.assertEqual(served[0], 200, served)
            with urllib.request.urlopen(url + "/get_model_info", timeout=60) as r:
                model_info = json.loads(r.read())
            self.assertEqual(model_info["weight_version"], "5")
            return served[1]["output_ids"]
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    def test_a_vllm_trainer_updates_rlhost_serve_per_tensor(self):
        self.assertEqual(self.send_from_python(False), self.want_b)

    def test_a_vllm_trainer_updates_rlhost_serve_packed(self):
        self.assertEqual(self.send_from_python(True), self.want_b)

    def test_a_torch_free_trainer_updates_rlhost_serve_with_the_id_in_the_request(self):
        self.assertEqual(self.send_from_python(False, unique_id=True), self.want_b)

    def test_our_trainer_reaches_a_vllm_worker_bit_for_bit(self):
        self.sync_into_a_vllm_worker("store")

    def test_our_trainer_reaches_a_vllm_worker_with_the_id_in_the_request(self):
        self.sync_into_a_vllm_worker("unique_id")

    def sync_into_a_vllm_worker(self, rendezvous):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        received, calls, state = {}, [], {}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(404)
                self.end_headers()

            def do_POST(self):
                calls.append(self.path.split("?")[0])
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n) or b"{}")
                path = self.path.split("?")[0]
                if path == "/init_weight_transfer_engine":
                    i = req["init_info"]
                    state["info"] = i
                    if "nccl_unique_id_b64" in i:  # vLLM's uid_init_process_group
                        uid = make_id(base64.b64decode(i["nccl_unique_id_b64"], validate=True))
                    else:
                        store = vllm_store(i["master_port"], i["rank_offset"], i["world_size"])
                        uid = VllmGroup(store, i["rank_offset"]).broadcast_obj(None, src=0)
                    state["nccl"] = PyNccl("cuda:1")
                    state["nccl"].init(i["world_size"], uid, i["rank_offset"])
                elif path == "/update_weights":
                    u = req["update_info"]
                    metas = [(n, getattr(torch, d), s) for n, d, s in
                             zip(u["names"], u["dtype_names"], u["shapes"])]
                    for n, d, s in metas:
                        t = torch.empty(s, dtype=d, device="cuda:1")
                        state["nccl"].broadcast(t)
                        received[n] = t.cpu()
                elif path == "/finish_weight_update":
                    state["version"] = req.get("weight_version")
                body = json.dumps({"message": "ok"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        http = ThreadingHTTPServer((HOST, 0), Handler)
        threading.Thread(target=http.serve_forever, daemon=True).start()
        try:
            client = self.rl.InferenceClient(f"http://{HOST}:{http.server_address[1]}",
                                             protocol="vllm")
            try:
                with self.rl.Model(self.b, {"device": "cuda:0"}) as m:
                    client.sync(m, 3, {"mode": "distributed", "master_address": HOST,
                                       "rendezvous": rendezvous})
            finally:
                client.close()
        finally:
            http.shutdown()
            http.server_close()
        for path in ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                     "/finish_weight_update"):
            self.assertIn(path, calls)
        self.assertEqual(state["version"], "3")
        # One rendezvous or the other, never both (vLLM refuses both).
        self.assertEqual("nccl_unique_id_b64" in state["info"], rendezvous == "unique_id")
        self.assertEqual("master_port" in state["info"], rendezvous == "store")
        self.assertEqual(sorted(received), sorted(self.weights_b))
        for name, want in self.weights_b.items():
            self.assertTrue(torch.equal(received[name].view(torch.uint8),
                                        want.contiguous().view(torch.uint8)), name)


if __name__ == "__main__":
    # NCCL refuses two ranks of one communicator on one device.
    if sys.argv[1:2] == ["Nccl"] and torch.cuda.device_count() < 2:
        print(f"SKIPPED: two CUDA devices needed, {torch.cuda.device_count()} found")
        sys.exit(77)
    unittest.main()
