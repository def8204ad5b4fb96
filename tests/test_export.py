#!/usr/bin/env python3
"""The way back to the official tooling (issue 30; docs/EXPORT.md), checked with readers that
know the formats, not with our writers' assumptions:

  lightning   tools/export_lightning of a tiny run: the file is read as torch.load reads it
              (zip with one top-level folder, data.pkl unpickled by the standard library's
              pickle with only the GLOBALs torch.load's weights_only unpickler allows, storages
              resolved through persistent ids, sizes and strides checked) and as Lightning's
              load_from_checkpoint uses it ("pytorch-lightning_version", "state_dict" with
              QCNet's keys and the run's bytes, "hyper_parameters" = exactly the official QCNet
              constructor arguments), its keys and shapes the official model's (the parity
              fixture's state_dict, made by ZikangZhou/QCNet with the same shaping arguments).
              Then torch (this interpreter's, or Debian's python3-torch) reads it as Lightning
              does: torch.load (and with weights_only=True on torch >= 2.0), and
              load_state_dict(strict=True) into a module tree of the official model's
              parameter names and shapes. Without torch that step is reported as not run,
              and under CI=true it fails (tools/install-deps installs python3-torch).
  submission  eval --predictions of a tiny run on AV2-like scenes, tools/av2_submission to
              parquet (and eval --submission, which runs the tool itself: the same rows), read back with pyarrow as av2's ChallengeSubmission.from_parquet does
              (group by scenario_id and track_id, one row per mode: probability and the 60 x / y
              of the trajectory) and checked with ChallengeSubmission's rules (probabilities
              sum to 1, trajectories (K, 60, 2), K <= 6) and against the model's outputs
              rotated back to the world frame here (QCNET.md §6.2, test_step).

usage: test_export.py QCTRAIN WORKDIR REPO [case...]
"""
import collections
import json
import math
import os
import pickle
import pickletools
import shutil
import struct
import subprocess
import sys
import zipfile

TINY = ["--preset", "cpu-smoke", "--quiet", "--set", "train.batch_size=1", "--set",
        "data.synthetic_scenes=8", "--set", "data.loader_threads=1", "--set",
        "model.pl2pl_radius=30", "--set", "model.pl2a_radius=15", "--set", "model.a2a_radius=15",
        "--set", "model.pl2m_radius=30", "--set", "model.a2m_radius=30", "--set",
        "model.time_span=3", "--set", "model.num_t2m_steps=6"]

# predictors/qcnet.py, QCNet.__init__ (docs/design/QCNET.md §1)
OFFICIAL_ARGS = ["dataset", "input_dim", "hidden_dim", "output_dim", "output_head",
                 "num_historical_steps", "num_future_steps", "num_modes", "num_recurrent_steps",
                 "num_freq_bands", "num_map_layers", "num_agent_layers", "num_dec_layers",
                 "num_heads", "head_dim", "dropout", "pl2pl_radius", "time_span", "pl2a_radius",
                 "a2a_radius", "num_t2m_steps", "pl2m_radius", "a2m_radius", "lr", "weight_decay",
                 "T_max", "submission_dir", "submission_file_name"]

QC = WORK = REPO = None


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok   " + msg)


def run(cmd, expect=0):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=WORK)
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != expect:
        fail("exit %d (expected %d): %s\n%s" % (r.returncode, expect, " ".join(cmd), out))
    return out


def safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    h = json.loads(blob[8:8 + n])
    meta = h.pop("__metadata__", {})
    return meta, {k: (v["shape"], blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
                  for k, v in h.items()}


# ---- a reader of torch.save's format (what torch.load does, from the standard library) -------

class FloatStorage:  # stands for torch.FloatStorage
    pass


class Tensor:
    def __init__(self, data, offset, size, stride):
        self.data, self.offset, self.size, self.stride = data, offset, tuple(size), tuple(stride)


def rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                      metadata=None):
    return Tensor(storage, storage_offset, size, stride)


# the GLOBALs torch.load(weights_only=True) allows that a state_dict checkpoint uses
ALLOWED = {("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor_v2,
           ("collections", "OrderedDict"): collections.OrderedDict,
           ("torch", "FloatStorage"): FloatStorage}


class TorchUnpickler(pickle.Unpickler):
    def __init__(self, f, records):
        super().__init__(f)
        self.records = records
        self.seen = []

    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            fail("data.pkl needs %s.%s, which torch.load(weights_only=True) refuses" %
                 (module, name))
        return ALLOWED[(module, name)]

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            fail("persistent id %r is not ('storage', type, key, location, numel)" % (pid,))
        _, typ, key, location, numel = pid
        if typ is not FloatStorage or location != "cpu":
            fail("storage %r: type %r at %r" % (key, typ, location))
        data = self.records.get("data/" + key)
        if data is None or len(data) != 4 * numel:
            fail("storage %s: %s bytes for %d floats" % (key, None if data is None else len(data),
                                                         numel))
        self.seen.append(key)
        return data


def torch_format_load(path):
    z = zipfile.ZipFile(path)
    names = z.namelist()
    tops = {n.split("/")[0] for n in names}
    check(len(tops) == 1 and all("/" in n for n in names), "one top-level folder (%s)" % tops)
    top = tops.pop()
    recs = {n[len(top) + 1:]: z.read(n) for n in names}
    check("data.pkl" in recs and recs.get("version", b"").strip() in (b"2", b"3"),
          "data.pkl and version (%r)" % recs.get("version"))
    check(recs.get("byteorder", b"little") == b"little", "byteorder little")
    for zi in z.infolist():
        check(zi.compress_type == zipfile.ZIP_STORED, "%s stored uncompressed" % zi.filename) \
            if zi.filename.endswith("data.pkl") else None
        if zi.compress_type != zipfile.ZIP_STORED:
            fail("%s is compressed" % zi.filename)
    with open(path, "rb") as f:
        for zi in z.infolist():
            f.seek(zi.header_offset)
            h = f.read(30)
            nlen, elen = struct.unpack("<HH", h[26:30])
            start = zi.header_offset + 30 + nlen + elen
            if "/data/" in zi.filename and start % 64:
                fail("%s starts at %d, not a multiple of 64" % (zi.filename, start))
    check(True, "every storage record starts at a multiple of 64 bytes")
    pickletools.dis(recs["data.pkl"], out=open(os.devnull, "w"))  # well formed
    import io
    u = TorchUnpickler(io.BytesIO(recs["data.pkl"]), recs)
    obj = u.load()
    nstor = sum(1 for k in recs if k.startswith("data/"))
    check(len(u.seen) == nstor, "every storage record is used (%d of %d)" % (len(u.seen), nstor))
    return obj


def case_lightning():
    run([QC] + TINY + ["train", "--steps", "2", "--out", "run"])
    ck = os.path.join(WORK, "qcnet.ckpt")
    run([sys.executable, os.path.join(REPO, "tools", "export_lightning"), "run", "--out", ck,
         "--no-torch"])
    obj = torch_format_load(ck)
    check(isinstance(obj, dict), "the checkpoint is a dict")
    for k in ("pytorch-lightning_version", "state_dict", "hyper_parameters", "global_step",
              "epoch"):
        check(k in obj, "it has %s" % k)
    meta, tensors = safetensors(os.path.join(WORK, "run", "ckpt-000002", "model.safetensors"))
    sd = obj["state_dict"]
    check(isinstance(sd, collections.OrderedDict) and set(sd) == set(tensors),
          "state_dict has model.safetensors' %d keys" % len(tensors))
    for name, (shape, data) in tensors.items():
        t = sd[name]
        stride, s = [], 1
        for d in reversed(shape):
            stride.append(s)
            s *= d
        if list(t.size) != shape or list(t.stride) != stride[::-1] or t.offset != 0 or \
                t.data != data:
            fail("tensor %s: size %s stride %s offset %d vs shape %s (or other bytes)" %
                 (name, t.size, t.stride, t.offset, shape))
    check(True, "every tensor: the run's shape, contiguous strides and bytes")
    hp = obj["hyper_parameters"]
    check(set(hp) == set(OFFICIAL_ARGS), "hyper_parameters are exactly the official QCNet "
          "constructor arguments (extra %s, missing %s)" %
          (sorted(set(hp) - set(OFFICIAL_ARGS)), sorted(set(OFFICIAL_ARGS) - set(hp))))
    cfg = json.loads(meta["qcnet_config"])
    check(all(hp[k] == cfg[k] for k in OFFICIAL_ARGS) and hp["hidden_dim"] == 32,
          "hyper_parameters equal the checkpoint's qcnet_config")
    check(obj["global_step"] == 2, "global_step is the optimizer step")
    # the official model built from these hyper_parameters has the parity fixture's state_dict
    # (ZikangZhou/QCNet's own, tests/data/qcnet-parity-tiny: the same constructor arguments but
    # radii, time_span and num_t2m_steps, which shape no tensor): the same keys and shapes
    fixture = os.path.join(REPO, "tests", "data", "qcnet-parity-tiny")
    with open(os.path.join(fixture, "manifest.json")) as f:
        official = json.load(f)["config"]
    shaping = ["input_dim", "hidden_dim", "output_dim", "output_head", "num_historical_steps",
               "num_future_steps", "num_modes", "num_recurrent_steps", "num_freq_bands",
               "num_map_layers", "num_agent_layers", "num_dec_layers", "num_heads", "head_dim"]
    check(all(hp[k] == official[k] for k in shaping),
          "the tiny run's shaping arguments are the parity fixture's")
    _, ref = safetensors(os.path.join(fixture, "weights.safetensors"))
    check(set(ref) == set(sd) and all(list(sd[k].size) == ref[k][0] for k in ref),
          "state_dict: the official model's %d keys and shapes (extra %s, missing %s)" %
          (len(ref), sorted(set(sd) - set(ref))[:4], sorted(set(ref) - set(sd))[:4]))
    py = torch_python()
    if py is None:
        if os.environ.get("CI") in ("true", "1"):
            fail("no python3 here imports torch (tools/install-deps installs Debian's "
                 "python3-torch): under CI=true torch.load must run")
        print("note torch is not installed: torch.load not run")
        return
    out = run([py, "-c", TORCH_CHECK, ck,
               os.path.join(WORK, "run", "ckpt-000002", "model.safetensors"),
               os.path.join(fixture, "weights.safetensors"), json.dumps(hp)])
    print(out.rstrip())


def torch_python():
    """An interpreter that imports torch: this one, else Debian's (python3-torch lives in
    /usr/lib/python3/dist-packages, which a pyenv or venv python does not see), else None."""
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and subprocess.run(
                [py, "-c", "import torch"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode == 0:
            return py
    return None


# run by an interpreter with torch: argv = checkpoint, the run's model.safetensors, the parity
# fixture's weights (the official model's state_dict), the hyper_parameters (JSON)
TORCH_CHECK = r"""
import json, struct, sys
import torch
ck, model, official, hp = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

def st(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    h = json.loads(blob[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["shape"], blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}

def fail(msg):
    print("FAIL  " + msg)
    sys.exit(1)

run, ref = st(model), st(official)

def same_tensors(t, how):
    for name, (shape, data) in run.items():
        x = t["state_dict"][name]
        if list(x.shape) != shape or x.numpy().tobytes() != data:
            fail("%s: tensor %s differs" % (how, name))
    if t["hyper_parameters"] != hp or t["global_step"] != 2:
        fail("%s: hyper_parameters or global_step differ" % how)
    print("ok    %s (torch %s) reads every tensor, the hyper_parameters and global_step"
          % (how, torch.__version__))

# what Lightning's load_from_checkpoint calls (pl_load: torch.load(f, map_location=...))
obj = torch.load(ck, map_location="cpu")
same_tensors(obj, "torch.load")
# torch < 2.0's weights_only unpickler has no BINFLOAT (opcode 71), so no checkpoint with a float
# hyper-parameter loads through it, torch.save's own included; from 2.0 on it must read
if int(torch.__version__.split(".")[0]) >= 2:
    same_tensors(torch.load(ck, map_location="cpu", weights_only=True),
                 "torch.load(weights_only=True)")
else:
    print("note  torch %s: its weights_only unpickler reads no float (BINFLOAT), "
          "torch.load(weights_only=True) not run" % torch.__version__)

# then load_from_checkpoint builds the model and calls load_state_dict(strict=True): a module
# tree with the official state_dict's names and shapes, as QCNet(**hyper_parameters) has them
class Node(torch.nn.Module):
    pass

root = Node()
for name, (shape, _) in ref.items():
    *path, leaf = name.split(".")
    m = root
    for p in path:
        if not hasattr(m, p):
            m.add_module(p, Node())
        m = getattr(m, p)
    m.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))
res = root.load_state_dict(obj["state_dict"], strict=True)
if res.missing_keys or res.unexpected_keys:
    fail("load_state_dict: missing %s, unexpected %s" % (res.missing_keys, res.unexpected_keys))
with torch.no_grad():
    for name, p in root.named_parameters():
        if p.numpy().tobytes() != run[name][1]:
            fail("load_state_dict: %s does not hold the run's bytes" % name)
print("ok    load_state_dict(strict=True) into the official model's %d parameters: every one "
      "holds the run's bytes" % len(ref))
"""


# ---- the AV2 submission ------------------------------------------------------------------------

def case_submission():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        fail("pyarrow is needed (tools/install-deps installs it)")
    av2 = os.path.join(REPO, "tests", "data", "av2-sample")
    shard = os.path.join(WORK, "av2.qcshard")
    run([sys.executable, os.path.join(REPO, "tools", "av2_to_qcshard"), "--out", shard,
         os.path.join(av2, "forecasting_scenarios")])
    run([QC] + TINY + ["train", "--steps", "1", "--out", "sub-run"])
    pred = os.path.join(WORK, "pred.safetensors")
    dump = os.path.join(WORK, "dump.safetensors")
    run([QC, "eval", "--weights", "sub-run", "--data", shard, "--predictions", pred, "--dump",
         dump, "--batch-size", "1"])
    # the emulated device (device memory, downloads) writes the same bytes as the CPU
    pred_emu = os.path.join(WORK, "pred-emu.safetensors")
    run([QC, "--device", "emu", "eval", "--weights", "sub-run", "--data", shard,
         "--predictions", pred_emu, "--batch-size", "1"])
    with open(pred, "rb") as a, open(pred_emu, "rb") as b:
        check(a.read() == b.read(), "eval --device emu --predictions: the CPU's bytes")
    out = os.path.join(WORK, "submission.parquet")
    run([sys.executable, os.path.join(REPO, "tools", "av2_submission"), pred, out])
    table = pq.read_table(out)
    names = table.schema.names
    check(names[:5] == ["scenario_id", "track_id", "probability", "predicted_trajectory_x",
                        "predicted_trajectory_y"], "the columns of ChallengeSubmission.to_parquet "
          "(%s)" % names)
    rows = table.to_pylist()
    groups = collections.OrderedDict()
    for r in rows:  # ChallengeSubmission.from_parquet: groupby(["scenario_id", "track_id"])
        groups.setdefault((r["scenario_id"], r["track_id"]), []).append(r)
    for (sid, tid), g in groups.items():
        probs = [r["probability"] for r in g]
        xs = [r["predicted_trajectory_x"] for r in g]
        ys = [r["predicted_trajectory_y"] for r in g]
        if not (1 <= len(g) <= 6 and abs(sum(probs) - 1.0) < 1e-5 and
                all(len(x) == 60 for x in xs) and all(len(y) == 60 for y in ys)):
            fail("%s/%s: %d modes, probabilities sum %g, lengths %s" %
                 (sid, tid, len(g), sum(probs), [len(x) for x in xs]))
    check(len(groups) >= 1, "%d focal tracks, each K <= 6 rows of 60 x and y, probabilities "
          "summing to 1 (ChallengeSubmission's checks)" % len(groups))
    # against the model's own outputs for the first scene (--dump: batch 1 = scene 1), rotated
    # back here: p_world = p R^T + origin, R by the heading at t = 49; softmax(pi)
    dmeta, d = safetensors(dump)
    sid0 = json.loads(dmeta["scenario_ids"])[0]
    loc_shape, loc = d["loc_refine_pos"]
    A, K, S, _ = loc_shape
    pi = struct.unpack("<%df" % (A * K), d["pi"][1])
    locf = struct.unpack("<%df" % (A * K * S * 2), loc)
    g = [(k, v) for k, v in groups.items() if k[0] == sid0]
    check(len(g) == 1, "one focal track for scenario %s" % sid0)
    focal = g[0][1]
    # the focal track in AV2's own file (not our data): its id, position and heading at t = 49
    raw = pq.read_table(os.path.join(av2, "forecasting_scenarios", sid0,
                                     "scenario_%s.parquet" % sid0)).to_pydict()
    fid = raw["focal_track_id"][0]
    check(g[0][0][1] == fid, "track_id is the scenario's focal_track_id (%s)" % fid)
    i49 = [i for i in range(len(raw["track_id"]))
           if raw["track_id"][i] == fid and raw["timestep"][i] == 49][0]
    ox, oy, th = raw["position_x"][i49], raw["position_y"][i49], raw["heading"][i49]
    c, sn = math.cos(th), math.sin(th)
    match = []
    for a in range(A):
        err = 0.0
        for k in range(K):
            for st in range(S):
                lx = locf[((a * K + k) * S + st) * 2]
                ly = locf[((a * K + k) * S + st) * 2 + 1]
                wx, wy = lx * c - ly * sn + ox, lx * sn + ly * c + oy
                err = max(err, abs(wx - focal[k]["predicted_trajectory_x"][st]),
                          abs(wy - focal[k]["predicted_trajectory_y"][st]))
        m = max(pi[a * K:(a + 1) * K])
        e = [math.exp(p - m) for p in pi[a * K:(a + 1) * K]]
        perr = max(abs(e[k] / sum(e) - focal[k]["probability"]) for k in range(K))
        if err < 1e-2 and perr < 1e-6:
            match.append(a)
    check(len(match) == 1, "the track is one agent's loc_refine_pos rotated by the heading at "
          "t = 49 and moved to its position (1 cm), probabilities softmax(pi) (agents %s)" %
          match)
    # in one step: eval --submission runs tools/av2_submission itself (python3 from PATH: this
    # interpreter's, which has pyarrow) and leaves no predictions file behind
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep +
               os.environ.get("PATH", ""))
    one = os.path.join(WORK, "one-step.parquet")
    r = subprocess.run([QC, "eval", "--weights", "sub-run", "--data", shard, "--submission", one,
                        "--batch-size", "1"], cwd=WORK, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    if r.returncode != 0:
        fail("eval --submission: exit %d\n%s" % (r.returncode, r.stdout.decode()))
    check(pq.read_table(one).to_pylist() == rows,
          "eval --submission writes the rows of eval --predictions + tools/av2_submission")
    check(not os.path.exists(one + ".predictions.tmp"), "no predictions file left beside it")
    # a python3 that fails (no pyarrow, say): eval fails naming the tool, and writes nothing
    fake = os.path.join(WORK, "fakebin")
    os.makedirs(fake, exist_ok=True)
    with open(os.path.join(fake, "python3"), "w") as f:
        f.write("#!/bin/sh\necho 'av2_submission: error: pyarrow is needed' >&2\nexit 2\n")
    os.chmod(os.path.join(fake, "python3"), 0o755)
    bad = os.path.join(WORK, "bad.parquet")
    r = subprocess.run([QC, "eval", "--weights", "sub-run", "--data", shard, "--submission", bad,
                        "--batch-size", "1"], cwd=WORK, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT,
                       env=dict(os.environ, PATH=fake + os.pathsep + os.environ.get("PATH", "")))
    out = r.stdout.decode()
    check(r.returncode == 1 and "av2_submission" in out and "exited 2" in out and
          not os.path.exists(bad) and not os.path.exists(bad + ".predictions.tmp"),
          "a failing tool: eval exits 1 naming it, no file written or left (exit %d)" %
          r.returncode)
    out = run([QC, "eval", "--weights", "sub-run", "--data", shard, "--submission",
               os.path.join(WORK, "no-such-dir", "s.parquet")], expect=2)
    check("does not exist" in out, "a --submission folder that does not exist: exit 2, named "
          "before the evaluation runs")


CASES = {"lightning": case_lightning, "submission": case_submission}


def main():
    global QC, WORK, REPO
    if len(sys.argv) < 4:
        fail(__doc__)
    QC, WORK, REPO = (os.path.abspath(a) for a in sys.argv[1:4])
    names = sys.argv[4:] or list(CASES)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    for n in names:
        print("---- " + n)
        CASES[n]()
    print("%d passed, 0 failed" % len(names))


if __name__ == "__main__":
    main()
