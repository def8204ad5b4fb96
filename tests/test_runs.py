#!/usr/bin/env python3
"""Run folders that remember themselves (issue 30; docs/CHECKPOINTS.md), through the built
binary on tiny runs:

  new-run      train --out into a non-empty folder is refused naming --resume / --overwrite; the
               stale-checkpoint case (an earlier run's ckpt-000003 beside a new run's
               ckpt-000002, a resume picking the stale one) cannot happen; --overwrite clears it.
  resume       --resume RUN with no preset continues the run's configuration and data; an
               option that contradicts it is refused naming the key and both values; other data
               needs --change-data; a data file changed since the run started is refused naming
               it and both hashes (run.json's and the file's now).
  validation   --eval-every / --val-data / --val-scenes are recorded in run.json and a resume
               without them validates as the run did; a value that contradicts the run's is
               refused naming the option and both values, unless --change-data.
  recovered-oom  an out-of-memory inside a step that the trainer rolls back and re-plans
               (QC_FAULT_OOM_STEP) is reported as a warning without the advice of a fatal one
               (no "hint:", no "lower train.batch_size"), and the run ends 0.
  retention    train.keep_last / train.keep_best (by train.keep_best_metric, read here from the
               run's own metrics.jsonl) keep exactly the checkpoints they promise; a resume takes
               the newest.
  metadata     model.safetensors' qcnet_config holds every constructor argument of the official
               QCNet with the run's values, so QCNet(**cfg) builds it.
  utf8         an --out that is not UTF-8 is refused before anything is written.
  stopped      a run that stops, by a fatal out-of-memory (QC_FAULT_OOM_STEP with no budget:
               nothing to re-plan) or by Ctrl-C (exit 130), still writes memory.json and
               report.html saying why (the reason, the step, the error).
  eval         eval --weights RUN needs no preset, refuses a contradicting model option, takes the
               run's --val-data when no --data is given and, for a run trained on data files
               without them, refuses to fall back to generated scenes; a run
               trained under device.budget evaluates under it (a forward keeps no stash).

usage: test_runs.py QCTRAIN WORKDIR [case...]
"""
import json
import os
import shutil
import struct
import signal
import subprocess
import sys
import time

TINY = ["--preset", "cpu-smoke", "--quiet", "--set", "train.batch_size=1", "--set",
        "data.synthetic_scenes=8", "--set", "data.loader_threads=1", "--set",
        "model.pl2pl_radius=30", "--set", "model.pl2a_radius=15", "--set", "model.a2a_radius=15",
        "--set", "model.pl2m_radius=30", "--set", "model.a2m_radius=30", "--set",
        "model.time_span=3", "--set", "model.num_t2m_steps=6"]

# predictors/qcnet.py, QCNet.__init__ (docs/design/QCNET.md §1), in order
OFFICIAL_ARGS = ["dataset", "input_dim", "hidden_dim", "output_dim", "output_head",
                 "num_historical_steps", "num_future_steps", "num_modes", "num_recurrent_steps",
                 "num_freq_bands", "num_map_layers", "num_agent_layers", "num_dec_layers",
                 "num_heads", "head_dim", "dropout", "pl2pl_radius", "time_span", "pl2a_radius",
                 "a2a_radius", "num_t2m_steps", "pl2m_radius", "a2m_radius", "lr", "weight_decay",
                 "T_max", "submission_dir", "submission_file_name"]

QC = None
WORK = None


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok   " + msg)


def run(args, expect=0, env=None):
    cmd = [QC] + args
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=WORK,
                       env=dict(os.environ, **env) if env else None)
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != expect:
        fail("exit %d (expected %d): %s\n%s" % (r.returncode, expect, " ".join(cmd), out))
    return out


def ckpts(run_dir):
    p = os.path.join(WORK, run_dir)
    return sorted(d for d in os.listdir(p) if d.startswith("ckpt-"))


def metrics(run_dir):
    with open(os.path.join(WORK, run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def st_header(path):
    """The JSON header of a safetensors file (the format's own layout, read here)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def gen(name, seed):
    run(["gen", "--scenes", "4", "--profile", "mixed", "--seed", str(seed), "--out", name])


def case_new_run():
    run(TINY + ["train", "--steps", "3", "--out", "new"])
    check(ckpts("new") == ["ckpt-000003"], "first run: ckpt-000003")
    out = run(TINY + ["train", "--steps", "2", "--out", "new"], expect=2)
    check("not empty" in out and "--resume new" in out and "--overwrite" in out,
          "a new run into the folder of an earlier run is refused, naming --resume and "
          "--overwrite")
    check(ckpts("new") == ["ckpt-000003"] and len(metrics("new")) == 3,
          "the refused run left the earlier run untouched (metrics.jsonl not truncated)")
    run(TINY + ["train", "--steps", "2", "--out", "new", "--overwrite"])
    check(ckpts("new") == ["ckpt-000002"], "--overwrite: only the new run's ckpt-000002 is there "
          "(no stale ckpt-000003)")
    check([m["step"] for m in metrics("new")] == [1, 2], "--overwrite: metrics.jsonl is the new "
          "run's")
    check(not any(d.startswith("new.overwritten") for d in os.listdir(WORK)),
          "--overwrite: the old run moved aside is removed")
    out = run(["train", "--resume", "new", "--steps", "3"])
    check("steps 2 -> 3" in out, "the resume takes the new run's checkpoint (step 2): " +
          out.splitlines()[0])
    os.makedirs(os.path.join(WORK, "empty"), exist_ok=True)
    run(TINY + ["train", "--steps", "1", "--out", "empty"])
    check(ckpts("empty") == ["ckpt-000001"], "an existing empty folder is a new run's")


def case_resume():
    gen("d1.qcshard", 1)
    gen("d2.qcshard", 2)
    run(TINY + ["train", "--data", "d1.qcshard", "--steps", "2", "--out", "r"])
    with open(os.path.join(WORK, "r", "run.json")) as f:
        data = json.load(f)["data"]
    d1 = os.path.realpath(os.path.join(WORK, "d1.qcshard"))
    check(len(data["files"]) == 1 and data["files"][0]["path"] == d1 and
          data["files"][0]["bytes"] == os.path.getsize(d1) and
          len(data["files"][0]["xxh3_64"]) == 16 and data["synthetic"] is False,
          "run.json records the data: absolute path, size, content hash")
    # no preset, no --data: the run's configuration (hidden_dim 32) and data
    out = run(["train", "--resume", "r", "--steps", "3"])
    check("steps 2 -> 3" in out and "d1.qcshard" in out,
          "resume without the preset or --data continues the run on its data")
    m = metrics("r")
    check([x["step"] for x in m] == [1, 2, 3], "the resumed run logged step 3")
    out = run(["train", "--resume", "r", "--steps", "4", "--set", "model.num_freq_bands=16"],
              expect=2)
    check("model.num_freq_bands = 8" in out and "model.num_freq_bands = 16" in out,
          "a contradicting --set is refused naming the key and both values")
    # a model key the merged configuration's own checks would blame on another key
    # (num_heads x head_dim != hidden_dim): the contradiction with the run is named first
    out = run(["train", "--resume", "r", "--steps", "4", "--set", "model.hidden_dim=64"],
              expect=2)
    check("model.hidden_dim = 32" in out and "model.hidden_dim = 64" in out and
          "num_heads" not in out,
          "--set model.hidden_dim=64 on resume: the contradiction with the run, named: %s" %
          out[-400:])
    out = run(["train", "--resume", "r", "--steps", "4", "--batch-size", "2"], expect=2)
    check("train.batch_size = 1" in out and "train.batch_size = 2" in out,
          "a contradicting flag is refused naming the key and both values")
    out = run(["train", "--resume", "r", "--steps", "4", "--data", "d2.qcshard"], expect=2)
    check("d1.qcshard" in out and "d2.qcshard" in out and "--change-data" in out,
          "other data is refused naming both, with --change-data as the way")
    # a shard changed since the run started
    p = os.path.join(WORK, "d1.qcshard")
    shutil.copy(p, p + ".bak")
    with open(p, "r+b") as f:  # one byte: same size, other content
        f.seek(os.path.getsize(p) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    check(os.path.getsize(p) == data["files"][0]["bytes"], "the changed file has its old size")
    out = run(["train", "--resume", "r", "--steps", "4"], expect=2)
    check(d1 in out and data["files"][0]["xxh3_64"] in out and "changed" in out,
          "a data file changed since the run started is refused naming it and its recorded "
          "hash")
    now = [w for w in out.replace(",", " ").split() if len(w) == 16 and
           all(c in "0123456789abcdef" for c in w) and w != data["files"][0]["xxh3_64"]]
    check(len(now) == 1, "... and the hash it has now (%s)" % now)
    gen("d1.qcshard", 5)  # other (valid) scenes under the same name
    out = run(["train", "--resume", "r", "--steps", "4"], expect=2)
    now = [w for w in out.replace(",", " ").split() if len(w) == 16 and
           all(c in "0123456789abcdef" for c in w) and w != data["files"][0]["xxh3_64"]]
    check("changed" in out and len(now) == 1, "other scenes under the same name: refused")
    run(["train", "--resume", "r", "--steps", "4", "--change-data"])
    with open(os.path.join(WORK, "r", "run.json")) as f:
        rec = json.load(f)["data"]["files"][0]["xxh3_64"]
    check(rec == now[0], "--change-data continues and records the data as it is now")
    shutil.copy(p + ".bak", p)
    out = run(["train", "--resume", "r", "--steps", "5", "--data", "d2.qcshard",
               "--change-data"])
    with open(os.path.join(WORK, "r", "run.json")) as f:
        files = json.load(f)["data"]["files"]
    check([f["path"] for f in files] == [os.path.realpath(os.path.join(WORK, "d2.qcshard"))],
          "--change-data --data d2: the run goes on on d2, recorded")
    out = run(TINY + ["train", "--steps", "1", "--out", "x", "--change-data"], expect=2)
    check("--change-data goes with --resume" in out, "--change-data without --resume refused")


def case_validation():
    gen("v1.qcshard", 7)
    gen("v2.qcshard", 8)
    run(TINY + ["train", "--steps", "2", "--out", "v", "--eval-every", "2", "--val-data",
                "v1.qcshard"])
    v1 = os.path.realpath(os.path.join(WORK, "v1.qcshard"))
    v2 = os.path.realpath(os.path.join(WORK, "v2.qcshard"))
    with open(os.path.join(WORK, "v", "run.json")) as f:
        rec = json.load(f)["validation"]
    check(rec == {"eval_every": 2, "val_scenes": 8, "files": [v1]},
          "run.json records the validation: %s" % rec)
    run(["train", "--resume", "v", "--steps", "4"])
    ev = {m["step"]: m["eval"] for m in metrics("v") if "eval" in m}
    check(sorted(ev) == [2, 4], "a resume without --eval-every validates every 2 steps as the "
          "run did (eval at %s)" % sorted(ev))
    check(ev[4]["scenes"] == ev[2]["scenes"] == 4,
          "... on the run's --val-data (4 scenes, not 8 generated): %s" %
          [ev[s]["scenes"] for s in sorted(ev)])
    out = run(["train", "--resume", "v", "--steps", "5", "--eval-every", "3"], expect=2)
    check("--eval-every 2" in out and "--eval-every 3" in out and "--change-data" in out,
          "a contradicting --eval-every is refused naming both values")
    out = run(["train", "--resume", "v", "--steps", "5", "--val-data", "v2.qcshard"], expect=2)
    check(v1 in out and v2 in out and "--change-data" in out,
          "a contradicting --val-data is refused naming both")
    out = run(["train", "--resume", "v", "--steps", "5", "--val-scenes", "3"], expect=2)
    check("--val-scenes 8" in out and "--val-scenes 3" in out,
          "a contradicting --val-scenes is refused naming both values")
    run(["train", "--resume", "v", "--steps", "5", "--eval-every", "2", "--val-data",
         "v1.qcshard"])
    check(len(ckpts("v")) >= 1, "the run's own values given again are accepted")
    run(["train", "--resume", "v", "--steps", "6", "--eval-every", "1", "--val-data",
         "v2.qcshard", "--change-data"])
    with open(os.path.join(WORK, "v", "run.json")) as f:
        rec = json.load(f)["validation"]
    check(rec == {"eval_every": 1, "val_scenes": 8, "files": [v2]},
          "--change-data takes other validation and records it: %s" % rec)
    ev = {m["step"]: m["eval"] for m in metrics("v") if "eval" in m}
    check(6 in ev, "step 6 validated under --eval-every 1")


def case_recovered_oom():
    args = TINY + ["--set", "device.budget=100MiB", "--set", "train.batch_size=2", "train",
                   "--steps", "2", "--out", "oom"]
    out = run(args, env={"QC_FAULT_OOM_STEP": "2"})
    warn = [ln for ln in out.splitlines() if "rolled back" in ln]
    check(warn and "out of device memory" in warn[0],
          "the out-of-memory injected in step 2 was recovered and reported")
    check("hint:" not in out and "lower train.batch_size" not in out,
          "a recovered out-of-memory gives no advice for a fatal one:\n" + out)
    check([m["step"] for m in metrics("oom")] == [1, 2] and metrics("oom")[1]["rolled_back"],
          "the run went on; step 2 is flagged rolled_back")


def case_retention():
    run(TINY + ["train", "--steps", "6", "--save-every", "1", "--out", "k", "--set",
                "train.keep_last=2"])
    check(ckpts("k") == ["ckpt-000005", "ckpt-000006"], "keep_last=2: the two newest")
    run(TINY + ["train", "--steps", "6", "--save-every", "1", "--eval-every", "1",
                "--val-scenes", "2", "--out", "b", "--set", "train.keep_last=1", "--set",
                "train.keep_best=2", "--set", "train.keep_best_metric=minADE"])
    ev = {m["step"]: m["eval"]["minADE"] for m in metrics("b") if "eval" in m}
    check(sorted(ev) == [1, 2, 3, 4, 5, 6], "an eval line per step")
    best = sorted(ev, key=lambda s: (ev[s], -s))[:2]
    want = sorted({6} | set(best))
    check(ckpts("b") == ["ckpt-%06d" % s for s in want],
          "keep_last=1 + keep_best=2 by minADE: %s (metrics %s)" % (want, ev))
    out = run(["train", "--resume", "b", "--steps", "7", "--eval-every", "1", "--val-scenes",
               "2"])
    check("steps 6 -> 7" in out, "the resume takes the newest checkpoint")
    # metric values chosen here (the run's own fall with every step, so "best" and "last"
    # would agree): every checkpoint kept, the eval lines rewritten, then one more step with
    # retention on: the best two by the rewritten values and the newest must stay
    run(TINY + ["train", "--steps", "4", "--save-every", "1", "--eval-every", "1",
                "--val-scenes", "2", "--out", "c"])
    chosen = {1: 2.0, 2: 1.0, 3: 100.0, 4: 50.0}
    lines = metrics("c")
    for m in lines:
        if "eval" in m:
            m["eval"]["minADE"] = chosen[m["step"]]
    with open(os.path.join(WORK, "c", "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(m) + "\n" for m in lines))
    run(["train", "--resume", "c", "--steps", "5", "--eval-every", "1", "--val-scenes", "2",
         "--set", "train.keep_last=1", "--set", "train.keep_best=2", "--set",
         "train.keep_best_metric=minADE"])
    ev5 = [m["eval"]["minADE"] for m in metrics("c") if "eval" in m and m["step"] == 5][0]
    check(ev5 > 2.0, "step 5's own minADE %g is not among the best two" % ev5)
    check(ckpts("c") == ["ckpt-000001", "ckpt-000002", "ckpt-000005"],
          "keep_best=2 keeps steps 2 and 1 (lowest minADE), keep_last=1 step 5: %s" % ckpts("c"))
    out = run(TINY + ["train", "--steps", "2", "--out", "nb", "--set", "train.keep_best=1"],
              expect=2)
    check("--eval-every" in out, "keep_best without validation is refused")
    out = run(TINY + ["train", "--steps", "2", "--out", "nb", "--set",
                      "train.keep_best_metric=accuracy"], expect=2)
    check("keep_best_metric" in out, "an unknown keep_best_metric is refused")
    # a retention interrupted between its rename and its removal
    os.rename(os.path.join(WORK, "b", ckpts("b")[0]),
              os.path.join(WORK, "b", ckpts("b")[0] + ".del"))
    run(["train", "--resume", "b", "--steps", "8", "--eval-every", "1", "--val-scenes", "2"])
    check(not any(d.endswith(".del") for d in os.listdir(os.path.join(WORK, "b"))),
          "a ckpt-<step>.del/ left by an interrupted retention is removed")


def case_metadata():
    run(TINY + ["train", "--steps", "1", "--out", "meta", "--set", "train.lr=0.003", "--set",
                "train.t_max=32", "--set", "train.weight_decay=0.02"])
    h = st_header(os.path.join(WORK, "meta", "ckpt-000001", "model.safetensors"))
    cfg = json.loads(h["__metadata__"]["qcnet_config"])
    missing = [a for a in OFFICIAL_ARGS if a not in cfg]
    check(not missing, "qcnet_config has every official constructor argument (missing %s)" %
          missing)
    want = {"dataset": "argoverse_v2", "input_dim": 2, "hidden_dim": 32, "output_dim": 2,
            "output_head": False, "num_historical_steps": 50, "num_future_steps": 60,
            "num_modes": 6, "num_recurrent_steps": 3, "num_freq_bands": 8, "num_map_layers": 1,
            "num_agent_layers": 2, "num_dec_layers": 2, "num_heads": 2, "head_dim": 16,
            "dropout": 0.1, "pl2pl_radius": 30, "time_span": 3, "pl2a_radius": 15,
            "a2a_radius": 15, "num_t2m_steps": 6, "pl2m_radius": 30, "a2m_radius": 30,
            "lr": 0.003, "weight_decay": 0.02, "T_max": 32}
    bad = {k: (cfg[k], v) for k, v in want.items() if cfg[k] != v}
    check(not bad, "qcnet_config has the run's values (differ: %s)" % bad)
    check(isinstance(cfg["submission_dir"], str) and isinstance(cfg["submission_file_name"], str),
          "submission_dir and submission_file_name are strings")



def run_bytes(args, expect):
    r = subprocess.run([QC.encode()] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       cwd=WORK)
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != expect:
        fail("exit %d (expected %d): %s\n%s" % (r.returncode, expect, args, out))
    return out


def case_utf8_raw():
    args = [a.encode() for a in TINY] + [b"train", b"--steps", b"1", b"--out", b"bad\xff\xfe"]
    out = run_bytes(args, 2)
    check("not valid UTF-8" in out, "an --out with invalid UTF-8 bytes is refused")
    check(not os.path.exists(os.path.join(WORK.encode(), b"bad\xff\xfe")),
          "nothing was created")
    args = [a.encode() for a in TINY] + [b"--set", b"train.out_dir=o\xc0\xafx", b"train",
                                         b"--steps", b"1"]
    out = run_bytes(args, 2)
    check("not valid UTF-8" in out, "an overlong UTF-8 form in train.out_dir is refused")
    out = run_bytes([a.encode() for a in TINY] + [b"train", b"--steps", b"1", b"--out",
                                                 "ok-\u00e9\u4e2d".encode()], 0)
    with open(os.path.join(WORK, "ok-\u00e9\u4e2d", "run.json"), encoding="utf-8") as f:
        json.load(f)
    check(True, "a valid UTF-8 --out is accepted and run.json reads as JSON")


def case_eval():
    gen("e1.qcshard", 3)
    run(TINY + ["train", "--data", "e1.qcshard", "--steps", "1", "--out", "ev"])
    out = run(["eval", "--weights", "ev"], expect=2)
    check("--data" in out and "generated scenes" in out,
          "eval --weights RUN of a run on data files refuses generated scenes unasked")
    # a run that validated on files: eval --weights RUN without --data evaluates on them
    gen("e2.qcshard", 5)
    run(["gen", "--scenes", "3", "--profile", "mixed", "--seed", "6", "--out", "e3.qcshard"])
    run(TINY + ["train", "--data", "e1.qcshard", "--steps", "1", "--val-data", "e2.qcshard",
                "--val-data", "e3.qcshard", "--out", "evv"])
    out = run(["eval", "--weights", "evv", "--json"])
    check(json.loads(out.strip().splitlines()[-1])["eval"]["scenes"] == 7 and
          "validation data" in out,
          "eval --weights RUN without --data: the run's --val-data (4 + 3 scenes): %s" % out[-300:])
    out = run(["eval", "--weights", "ev", "--data", "e1.qcshard", "--json"])
    check(json.loads(out.strip().splitlines()[-1])["eval"]["scenes"] == 4,
          "eval --weights RUN needs no preset (hidden_dim 32 from the run)")
    run(["eval", "--weights", "ev", "--synthetic", "--scenes", "2", "--json"])
    out = run(["eval", "--weights", "ev", "--data", "e1.qcshard", "--set",
               "model.num_freq_bands=16"], expect=2)
    check("model.num_freq_bands = 8" in out and "model.num_freq_bands = 16" in out,
          "eval: a contradicting model option is refused naming both values")
    # a run trained under a budget evaluates under it: the forward alone keeps no stash for a
    # backward (before, every MLP, Fourier and GRU stash stayed to the end of the forward and
    # eval of a 48 MiB run ran out of memory at any batch size)
    run(TINY + ["train", "--data", "e1.qcshard", "--steps", "2", "--set", "device.budget=48MiB",
                "--out", "evb"])
    train_peak = max(m["peak_device_bytes"] for m in metrics("evb") if "peak_device_bytes" in m)
    out = run(["eval", "--weights", "evb", "--data", "e1.qcshard", "--batch-size", "1", "--json"])
    ev = json.loads(out.strip().splitlines()[-1])["eval"]
    check(ev["scenes"] == 4 and ev["peak_device_bytes"] <= 48 << 20,
          "eval --weights RUN under the run's 48 MiB budget: peak %d" % ev["peak_device_bytes"])
    check(ev["peak_device_bytes"] < train_peak,
          "eval's forward (peak %d) needs less than a training step under the budget (%d)" %
          (ev["peak_device_bytes"], train_peak))
    # the device path of the same forward (the emulated device) gives the CPU's figures
    out = run(["--device", "emu", "eval", "--weights", "evb", "--data", "e1.qcshard",
               "--batch-size", "1", "--json"])
    emu = json.loads(out.strip().splitlines()[-1])["eval"]
    cpu = ev
    keys = [k for k in cpu if k not in ("seconds", "peak_device_bytes")]
    check(all(emu[k] == cpu[k] for k in keys),
          "eval on the emulated device equals the CPU's: %s" %
          [(k, emu[k], cpu[k]) for k in keys if emu[k] != cpu[k]])


def stopped_report(run_dir, reason, step, words):
    """memory.json's "stopped" names reason, step and every one of words; report.html was
    written at the stop and embeds the same."""
    with open(os.path.join(WORK, run_dir, "memory.json")) as f:
        stop = json.load(f).get("stopped") or {}
    check(stop.get("reason") == reason and stop.get("step") == step and
          all(w in stop.get("message", "") for w in words),
          "%s: memory.json says why the run stopped: %s" % (run_dir, stop))
    path = os.path.join(WORK, run_dir, "report.html")
    check(os.path.exists(path), "%s: report.html was written at the stop" % run_dir)
    with open(path, encoding="utf-8") as f:
        html = f.read()
    check('"stopped":{"reason":"%s","step":%d' % (reason, step) in html,
          "%s: report.html, written at the stop, carries it" % run_dir)


def case_stopped():
    # a fatal out-of-memory (no budget: nothing to re-plan; QC_FAULT_OOM_STEP makes step 2 run
    # out) exits 1 and still writes memory.json and report.html explaining it
    out = run(TINY + ["train", "--steps", "3", "--out", "fatal"], expect=1,
              env={"QC_FAULT_OOM_STEP": "2"})
    check("step 2" in out and "failed" in out, "the fatal out-of-memory is named: %s" % out[-400:])
    stopped_report("fatal", "error", 2, ["step 2", "allocation of", "failed"])
    # Ctrl-C: the step running ends, a checkpoint is written, exit 130, and the report says so
    p = subprocess.Popen([QC] + TINY + ["train", "--steps", "200", "--out", "int"], cwd=WORK,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    mpath = os.path.join(WORK, "int", "metrics.jsonl")
    for _ in range(1200):  # up to 120 s for step 1's line
        if os.path.exists(mpath) and os.path.getsize(mpath) > 0:
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out = p.communicate(timeout=300)[0].decode("utf-8", "replace")
    check(p.returncode == 130, "SIGINT: exit %d (130 expected)\n%s" % (p.returncode, out[-600:]))
    last = [m for m in metrics("int") if "peak_device_bytes" in m][-1]["step"]
    check(last < 200, "SIGINT stopped the run early (step %d)" % last)
    stopped_report("int", "SIGINT", last, [])


CASES = {"new-run": case_new_run, "resume": case_resume, "validation": case_validation,
         "recovered-oom": case_recovered_oom, "retention": case_retention,
         "metadata": case_metadata, "utf8": case_utf8_raw, "eval": case_eval,
         "stopped": case_stopped}


def main():
    global QC, WORK
    if len(sys.argv) < 3:
        fail(__doc__)
    QC = os.path.abspath(sys.argv[1])
    WORK = os.path.abspath(sys.argv[2])
    names = sys.argv[3:] or list(CASES)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    for n in names:
        print("---- " + n)
        CASES[n]()
    print("%d passed, 0 failed" % len(names))


if __name__ == "__main__":
    main()
