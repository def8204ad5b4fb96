#!/usr/bin/env python3
"""test_precision_run.py: train.precision end to end through the qctrain binary (docs/PRECISION.md).

  smoke QCTRAIN DIR     20 steps of cpu-smoke in fp32, bf16 and fp16: the mean loss of the last 5
                        steps within 5 % of fp32's, the step's peak device bytes (max over the
                        steps) at most 0.75x fp32's.
  scaling QCTRAIN DIR   fp16 loss scaling: a forced overflow (QC_FAULT_GRAD_OVERFLOW_STEP=2) skips
                        step 2, the weights and AdamW moments of checkpoint 2 equal checkpoint 1's
                        bit for bit, the scale halves (2^16 -> 2^15); loss_scale_window=2 good
                        steps double it back; the checkpoint holds it and a resume continues
                        with it.
A fourth argument "cuda" runs the same on the CUDA device (test_precision_*_cuda, label gpu):
exit 77 in a CPU-only build or on a machine without an NVIDIA GPU; fp32 peaks and losses are
then compared within the same bounds, the forced overflow's bit-for-bit skip included.
Exit 0 on success, 1 with the failures listed.
"""
import json
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


def smoke(qctrain, root):
    steps = int(os.environ.get("QC_PRECISION_STEPS", "20"))
    res = {}
    for p in ("fp32", "bf16", "fp16"):
        out = os.path.join(root, "smoke-" + p)
        shutil.rmtree(out, ignore_errors=True)
        train(qctrain, out, ["train.precision=" + p, "train.steps=%d" % steps])
        rows = metrics(out)
        expect(len(rows) == steps, "%s: %d steps logged" % (p, len(rows)))
        last = [r["loss"] for r in rows[-5:]]
        peak = max(r["peak_device_bytes"] for r in rows)
        res[p] = (sum(last) / len(last), peak)
        print("  %s: mean loss of the last 5 steps %.6g, peak device bytes %d" % (p, res[p][0], peak))
    for p in ("bf16", "fp16"):
        rel = abs(res[p][0] - res["fp32"][0]) / abs(res["fp32"][0])
        expect(rel <= 0.05, "%s: last-5 mean loss %.6g vs fp32 %.6g (%.2f %%)"
               % (p, res[p][0], res["fp32"][0], 100 * rel))
        ratio = res[p][1] / res["fp32"][1]
        print("  %s: loss within %.2f %% of fp32, peak %.3fx fp32" % (p, 100 * rel, ratio))
        expect(ratio <= 0.75, "%s: peak %d is %.3fx fp32's %d" % (p, res[p][1], ratio, res["fp32"][1]))


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


def have_gpu(qctrain):
    """A CUDA build (qctrain version) on a machine with an NVIDIA device node."""
    v = subprocess.run([qctrain, "version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    return "cuda: yes" in v.stdout and os.path.exists("/dev/nvidia0")


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in ("smoke", "scaling") or \
            (len(sys.argv) == 5 and sys.argv[4] != "cuda"):
        raise SystemExit(__doc__)
    if len(sys.argv) == 5:
        if not have_gpu(sys.argv[2]):
            print("skipped: no CUDA build or no GPU")
            return 77
        DEVICE.extend(["--device", "cuda"])
    os.makedirs(sys.argv[3], exist_ok=True)
    {"smoke": smoke, "scaling": scaling}[sys.argv[1]](sys.argv[2], sys.argv[3])
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
