#!/usr/bin/env python3
"""test_precision_run.py: train.precision end to end through the qctrain binary (docs/PRECISION.md).

  smoke QCTRAIN DIR     20 steps of cpu-smoke in fp32, bf16 and fp16: the mean loss of the last 5
                        steps within 5 % of fp32's; the step's peak device bytes (max over the
                        steps) net of the fixed bytes at most 0.75x fp32's. The fixed bytes are
                        the planner's (`qctrain plan --json`, fixed_bytes: parameters,
                        gradients, AdamW moments and segments, the staged batch, and on CUDA the
                        ops' 16 MiB reduction/cuBLAS workspace): they are live at the peak in
                        every precision, so 16-bit storage can only shrink the rest, and on
                        CUDA the workspace alone pushes the gross ratio toward 1 (the planner
                        predicts 0.756x gross, 0.727x net there; docs/PRECISION.md).
  scaling QCTRAIN DIR   fp16 loss scaling: a forced overflow (QC_FAULT_GRAD_OVERFLOW_STEP=2) skips
                        step 2, the weights and AdamW moments of checkpoint 2 equal checkpoint 1's
                        bit for bit, the scale halves (2^16 -> 2^15); loss_scale_window=2 good
                        steps double it back; the checkpoint holds it and a resume continues
                        with it. Then the first step's AdamW moments (exp_avg,
                        sqrt(exp_avg_sq)) of an fp16 run equal fp32's within a bound derived
                        from fp16's rounding (MOMENT_TOL): a gradient not unscaled before AdamW,
                        or unscaled by a wrong power of 2, fails it.
A fourth argument "cuda" runs the same on the CUDA device (test_precision_*_cuda, label gpu),
the forced overflow's bit-for-bit skip included. Whether it runs is decided by the rule of
tests/cuda_probe.h on what the binary reports (`qctrain version --json`: cudaGetDeviceCount's
error and device count): exit 77 only in a CPU-only build or where there is no GPU (no device,
no NVIDIA driver); a GPU that is there but cannot be used fails (exit 1).
Exit 0 on success, 1 with the failures listed.
"""
import array
import ctypes
import json
import math
import os
import shutil
import struct
import subprocess
import sys

FAILS = []
DEVICE = []  # ["--device", "cuda"] for the GPU variants


def expect(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("  FAIL:", msg)


def train(qctrain, out, sets, env=None, resume=False, steps=None):
    cmd = [qctrain, "train", "--preset", "cpu-smoke"] + DEVICE
    if resume:
        cmd += ["--resume", out, "--steps", str(steps)]
    else:
        cmd += ["--out", out]
    for s in sets:
        cmd += ["--set", s]
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout[-4000:])
        raise SystemExit("qctrain failed: " + " ".join(cmd))
    return r.stdout


def metrics(out):
    rows = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if "step" in d and "loss" in d:
                rows.append(d)
    return rows


def safetensors(path):
    """(header dict, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def ckpt(out, step):
    return os.path.join(out, "ckpt-%06d" % step)


def plan(qctrain, precision):
    """The planner's view of one cpu-smoke step in this precision (`qctrain plan --json`)."""
    cmd = [qctrain, "plan", "--preset", "cpu-smoke"] + DEVICE + \
        ["--set", "train.precision=" + precision, "--json"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(r.stderr[-4000:])
        raise SystemExit("qctrain failed: " + " ".join(cmd))
    return json.loads(r.stdout)


def smoke(qctrain, root):
    steps = int(os.environ.get("QC_PRECISION_STEPS", "20"))
    res = {}
    fixed = {}
    predicted = {}
    for p in ("fp32", "bf16", "fp16"):
        out = os.path.join(root, "smoke-" + p)
        shutil.rmtree(out, ignore_errors=True)
        train(qctrain, out, ["train.precision=" + p, "train.steps=%d" % steps])
        rows = metrics(out)
        expect(len(rows) == steps, "%s: %d steps logged" % (p, len(rows)))
        last = [r["loss"] for r in rows[-5:]]
        peak = max(r["peak_device_bytes"] for r in rows)
        res[p] = (sum(last) / len(last), peak)
        pl = plan(qctrain, p)
        fixed[p] = pl["fixed_bytes"]
        predicted[p] = pl["predicted_peak_bytes"]
        print("  %s: mean loss of the last 5 steps %.6g, peak device bytes %d (fixed %d; the "
              "planner predicts %d)" % (p, res[p][0], peak, fixed[p], predicted[p]))
    # the fixed bytes do not depend on the precision (fp32 master weights, gradients and
    # moments; the workspace): the premise of the net comparison
    expect(fixed["bf16"] == fixed["fp32"] and fixed["fp16"] == fixed["fp32"],
           "the planner's fixed bytes depend on the precision: %s" % fixed)
    f = fixed["fp32"]
    expect(0 < f < res["fp32"][1], "fixed bytes %d not below fp32's peak %d" % (f, res["fp32"][1]))
    for p in ("bf16", "fp16"):
        rel = abs(res[p][0] - res["fp32"][0]) / abs(res["fp32"][0])
        expect(rel <= 0.05, "%s: last-5 mean loss %.6g vs fp32 %.6g (%.2f %%)"
               % (p, res[p][0], res["fp32"][0], 100 * rel))
        gross = res[p][1] / res["fp32"][1]
        net = (res[p][1] - f) / (res["fp32"][1] - f)
        pred = (predicted[p] - f) / (predicted["fp32"] - f)
        print("  %s: loss within %.2f %% of fp32, peak %.3fx fp32 (net of the fixed bytes %.3fx;"
              " the planner predicts %.3fx net)" % (p, 100 * rel, gross, net, pred))
        expect(net <= 0.75, "%s: peak %d net of the fixed %d bytes is %.3fx fp32's %d"
               % (p, res[p][1], f, net, res["fp32"][1]))


def scaling(qctrain, root):
    out = os.path.join(root, "scaling")
    shutil.rmtree(out, ignore_errors=True)
    train(qctrain, out, ["train.precision=fp16", "train.steps=4", "train.loss_scale_window=2",
                         "train.save_every=1"], env={"QC_FAULT_GRAD_OVERFLOW_STEP": "2"})
    rows = {r["step"]: r for r in metrics(out)}
    scale = {s: rows[s].get("loss_scale") for s in rows}
    print("  loss scale per step:", scale, "skipped:", [s for s in rows if rows[s].get("skipped")])
    expect([s for s in rows if rows[s].get("skipped")] == [2], "only step 2 skipped")
    expect(scale == {1: 65536, 2: 65536, 3: 32768, 4: 32768}, "scale per step %s" % scale)
    for f in ("model.safetensors", "optim.safetensors"):
        h1, d1 = safetensors(os.path.join(ckpt(out, 1), f))
        h2, d2 = safetensors(os.path.join(ckpt(out, 2), f))
        h1.pop("__metadata__", None)
        h2.pop("__metadata__", None)
        expect(h1 == h2 and d1 == d2, "%s of the skipped step differs from step 1's" % f)
        h3, d3 = safetensors(os.path.join(ckpt(out, 3), f))
        h3.pop("__metadata__", None)
        expect(d3 != d2, "%s unchanged by step 3" % f)
    meta = {}
    for s in (2, 4):
        h, _ = safetensors(os.path.join(ckpt(out, s), "optim.safetensors"))
        meta[s] = h.get("__metadata__", {}).get("loss_scale_log2")
    # after step 2 the scale is 2^15; steps 3 and 4 are the window's two good steps: 2^16
    expect(meta == {2: "15", 4: "16"}, "checkpoint loss_scale_log2 %s" % meta)
    train(qctrain, out, ["train.precision=fp16", "train.loss_scale_window=2"], resume=True, steps=5)
    rows = {r["step"]: r for r in metrics(out)}
    expect(5 in rows and rows[5].get("loss_scale") == 65536,
           "resumed step 5 ran at %s" % (rows.get(5, {}).get("loss_scale")))


def tensors(path, prefix):
    """{name: list of floats} of the F32 tensors of a safetensors file whose names start with
    prefix."""
    h, d = safetensors(path)
    out = {}
    for name, t in h.items():
        if name == "__metadata__" or not name.startswith(prefix):
            continue
        if t["dtype"] != "F32":
            raise SystemExit("%s: %s is %s, not F32" % (path, name, t["dtype"]))
        a = array.array("f")
        a.frombytes(d[t["data_offsets"][0]:t["data_offsets"][1]])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = a
    return out


# fp16's unit roundoff: 11 significant bits, round to nearest
U16 = 2.0 ** -11
# The first step's AdamW moments of an fp16 run against fp32's (same seed, same batch). AdamW's
# first step writes exp_avg = (1 - b1) g and exp_avg_sq = (1 - b2) g^2 of the *unscaled* gradient
# g, so with g16 = g32 (1 + e) exp_avg and sqrt(exp_avg_sq) are both off by exactly e: the test
# compares exp_avg and sqrt(exp_avg_sq), norm-wise over all parameters
# (||x16 - x32|| / ||x32||), against one bound on e.
# The bound, from fp16's rounding: fp16 rounds every activation and GEMM operand to 11
# significant bits (docs/PRECISION.md), each a relative error of at most u = 2^-11. A gradient is
# a sum of products along the paths from the loss to the parameter; to first order each product
# is off by at most K u relative, K the rounded operands on its path, and so is the sum (the
# fp32 accumulations add ~2^-24 per term, nothing at this scale). cpu-smoke's longest path runs
# from the map encoder's FourierEmbedding through pt2pl, pl2pl, 2 agent layers (t, pl2a, a2a)
# and the proposal decoder (3 recurrent steps x (2 layers x (t2m, pl2m, a2m) + m2m)): 29
# attention layers, each at most ~20 roundings on a path (forward: pre-norm, q/k/v, score,
# softmax, aggregate, gate, output, post-norm, feed-forward norm, 2 linears, ReLU; backward: the
# output gradient of each of its ~6 linears), plus ~60 in the FourierEmbeddings, the GRU and
# the output MLPs: K = 29 x 20 + 60 = 640, K u = 0.31. Elements are not compared one by one: a
# gradient that is a sum of cancelling terms (near zero) has a large relative error that means
# nothing for the update. Measured (cpu-smoke, CPU): e = 0.0095 norm-wise, ~30x below: the
# roundings' errors have random signs (their rms grows as sqrt(K), not K). What it must catch:
# a gradient left scaled (no unscale: e = 2^16 - 1) or unscaled by a wrong power of 2
# (e = 0.5 or 1), all far outside 0.31.
MOMENT_PATH_ROUNDINGS = 29 * 20 + 60
MOMENT_TOL = MOMENT_PATH_ROUNDINGS * U16


def moments(qctrain, root):
    """The AdamW moments of the first fp16 step equal fp32's within MOMENT_TOL (above)."""
    got = {}
    for p in ("fp32", "fp16"):
        out = os.path.join(root, "moments-" + p)
        shutil.rmtree(out, ignore_errors=True)
        train(qctrain, out, ["train.precision=" + p, "train.steps=1", "train.save_every=1"])
        got[p] = os.path.join(ckpt(out, 1), "optim.safetensors")
    for prefix, root_of in (("exp_avg.", False), ("exp_avg_sq.", True)):
        a32, a16 = tensors(got["fp32"], prefix), tensors(got["fp16"], prefix)
        expect(a32 and sorted(a32) == sorted(a16), "%s tensors: fp32 %d, fp16 %d names"
               % (prefix, len(a32), len(a16)))
        num = den = dot = 0.0
        worst = (0.0, "")
        for name in sorted(a32):
            x, y = a32[name], a16.get(name, [])
            if len(x) != len(y):
                expect(False, "%s: %d elements in fp32, %d in fp16" % (name, len(x), len(y)))
                continue
            if root_of:  # sqrt(exp_avg_sq) = sqrt(1 - b2) |g|: off by e as exp_avg is
                x, y = [math.sqrt(v) for v in x], [math.sqrt(v) for v in y]
            n2 = sum((b - a) * (b - a) for a, b in zip(x, y))
            d2 = sum(a * a for a in x)
            num, den, dot = num + n2, den + d2, dot + sum(a * b for a, b in zip(x, y))
            if d2 > 0 and math.sqrt(n2 / d2) > worst[0]:
                worst = (math.sqrt(n2 / d2), name)
        what = ("sqrt(%s*)" if root_of else "%s*") % prefix
        rel = math.sqrt(num / den) if den > 0 else float("inf")
        fit = dot / den if den > 0 else float("nan")  # fp16's scale on fp32's: 1 expected
        print("  first step's %s of fp16 vs fp32: relative error %.3g (bound %.3g), fitted "
              "scale %.6g; the worst tensor %s at %.3g" % (what, rel, MOMENT_TOL, fit,
                                                           worst[1], worst[0]))
        expect(den > 0, "%s: fp32's moments are all zero" % what)
        expect(rel <= MOMENT_TOL, "%s: fp16's first-step moments off fp32's by %.3g relative "
               "(bound %.3g; fitted scale %.6g)" % (what, rel, MOMENT_TOL, fit))

# cudaError_t values of tests/cuda_probe.h
CUDA_SUCCESS, CUDA_ERR_STUB_LIBRARY, CUDA_ERR_INSUFFICIENT_DRV, CUDA_ERR_NO_DEVICE = 0, 34, 35, 100


def driver_installed():
    """libcuda.so.1 (the NVIDIA driver's library) can be loaded, whether or not it works."""
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def cuda_verdict(qctrain):
    """("run" | "skip" | "fail", reason): qc_test_cuda_verdict of tests/cuda_probe.h applied to
    what the binary's CUDA runtime answers (qctrain version --json)."""
    v = subprocess.run([qctrain, "version", "--json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if v.returncode != 0:
        return "fail", "qctrain version --json failed (exit %d): %s" % (v.returncode, v.stderr)
    cuda = json.loads(v.stdout)["cuda"]
    if not cuda["built"]:
        return "skip", "a CPU-only build has no CUDA backend"
    err, n, name = cuda["probe_error"], cuda["devices"], cuda["probe_error_name"]
    if err == CUDA_SUCCESS:
        return ("run", "%d CUDA device(s)" % n) if n > 0 else ("skip", "no CUDA device")
    if err == CUDA_ERR_NO_DEVICE:
        return "skip", "no CUDA device (%s)" % name
    if err == CUDA_ERR_STUB_LIBRARY:
        return "skip", "no NVIDIA driver: the toolkit's stub libcuda answered (%s)" % name
    if err == CUDA_ERR_INSUFFICIENT_DRV and not driver_installed():
        return "skip", "no NVIDIA driver installed (libcuda.so.1 not found)"
    if err == CUDA_ERR_INSUFFICIENT_DRV:
        return "fail", "the NVIDIA driver is older than the CUDA runtime (%s)" % name
    return "fail", "the CUDA runtime cannot initialise the GPU: cudaGetDeviceCount returned " \
        "%s (%d)" % (name, err)


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in ("smoke", "scaling") or \
            (len(sys.argv) == 5 and sys.argv[4] != "cuda"):
        raise SystemExit(__doc__)
    if len(sys.argv) == 5:
        verdict, why = cuda_verdict(sys.argv[2])
        if verdict == "skip":
            print("skip:", why)
            return 77
        if verdict == "fail":
            print("FATAL:", why)
            return 1
        print(" ", why)
        DEVICE.extend(["--device", "cuda"])
    os.makedirs(sys.argv[3], exist_ok=True)
    if sys.argv[1] == "smoke":
        smoke(sys.argv[2], sys.argv[3])
    else:
        scaling(sys.argv[2], sys.argv[3])
        moments(sys.argv[2], sys.argv[3])
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
